"""`ddprun --rdzv-backend=etcd` on a three-member etcd whose members stop (SIGKILL): a running
job survives losing a follower, the leader, or every member for 10 s, with no restart spent;
a node's death is handled while a member is down; a list whose first member is down still
forms. (Frozen members: test_etcd_frozen.py; the scenarios: ha_scenarios.py.)"""
import signal
import time

import pytest

from etcd_helpers import steps_done
from ha_scenarios import (check_undisturbed, job_survives_losing_a_member,
                          list_whose_first_member_is_down_forms,
                          node_death_while_a_member_is_down, two_gloo_nodes)


@pytest.mark.parametrize("which", ["follower", "leader"])
def test_running_job_survives_losing_a_member(etcd3, cluster, tmp_path, which):
    job_survives_losing_a_member(etcd3, cluster, tmp_path, which == "leader", signal.SIGKILL)


def test_all_members_down_for_ten_seconds(etcd3, cluster, tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    agents = two_gloo_nodes(etcd3, cluster, d, "outage", [0, 1, 2])
    etcd3.stop_all(signal.SIGKILL)
    before = steps_done(d, world=2)
    time.sleep(10)  # the outage
    assert steps_done(d, world=2) >= before + 20, "the workers stopped training without etcd"
    assert all(a.running() for a in agents), [a.log() for a in agents]
    etcd3.start_all()
    # Back: the agents keep their leases alive again (a lease they lost would make the other
    # node's agent re-form within its TTL, seen by check_undisturbed).
    check_undisturbed(agents, d, quiet_s=5)


def test_node_death_while_a_member_is_down(etcd3, cluster, tmp_path):
    node_death_while_a_member_is_down(etcd3, cluster, tmp_path, signal.SIGKILL)


def test_list_whose_first_member_is_down_still_forms(etcd3, cluster, tmp_path):
    list_whose_first_member_is_down_forms(etcd3, cluster, tmp_path, signal.SIGKILL)
