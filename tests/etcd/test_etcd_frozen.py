"""`ddprun --rdzv-backend=etcd` on a three-member etcd whose member the agents use freezes
(SIGSTOP): its connections stay open, the kernel still accepts new ones and answers TCP
keep-alive, and nothing is ever answered, as when its host hangs or its disk stalls. The
agents must give up on it in time to keep their leases (TTL 1 s x 3): a running job goes on
undisturbed, a node's death is still noticed, and a list whose first member is frozen
forms in one round. (The same scenarios with stopped members: test_etcd_ha.py.)"""
import signal

from ha_scenarios import (job_survives_losing_a_member, list_whose_first_member_is_down_forms,
                          node_death_while_a_member_is_down)


def test_running_job_survives_its_member_freezing(etcd3, cluster, tmp_path):
    job_survives_losing_a_member(etcd3, cluster, tmp_path, True, signal.SIGSTOP)


def test_node_death_while_a_member_is_frozen(etcd3, cluster, tmp_path):
    node_death_while_a_member_is_down(etcd3, cluster, tmp_path, signal.SIGSTOP)


def test_list_whose_first_member_is_frozen_still_forms(etcd3, cluster, tmp_path):
    list_whose_first_member_is_down_forms(etcd3, cluster, tmp_path, signal.SIGSTOP)
