"""The init storm through store proxies, for tests/bench/store --only proxy.

Every node of a large job runs an agent, and with --store-proxy the node's ranks reach the job's
store through their agent's proxy (store/proxy.hpp): one connection per node, requests asked
alike sent once. Here the nodes are simulated: store_proxy_host processes each host up to
PROXIES_PER_HOST proxies (one per node of 8 ranks, each with its own upstream connection), and
store_loadgen processes each drive up to CLIENTS_PER_GENERATOR ranks, every group of 8
connecting to its own proxy. The store, the proxy hosts and the generators share one network
namespace with only loopback, and every process stays under the machine's 20,000-descriptor
hard limit (a proxy holds 10: 8 clients, its upstream link, its listener).

Reported per storm: wall time (first connect to the last rank's barrier release), the store's
CPU seconds, connections at the store, requests at the store per rank (the proxies count what
they send upstream and what their clients sent; without proxies the store gets what the clients
send), and the proxy hosts' CPU seconds. On this 2-core machine the proxies of every node share
the cores with the store and the generators; on real hosts each node's proxy has its own.
"""
import math
import pathlib
import subprocess
import tempfile

PROXIES_PER_HOST = 1800
CLIENTS_PER_GENERATOR = 16384
RANKS_PER_NODE = 8
TICK = None


def cpu_seconds(pid):
    import os
    global TICK
    TICK = TICK or os.sysconf("SC_CLK_TCK")
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def chunks(total, most):
    """`total` split into ceil(total / most) nearly equal parts, each a multiple of 8 where
    `total` is."""
    parts = math.ceil(total / most)
    base = (total // parts) // RANKS_PER_NODE * RANKS_PER_NODE or total // parts
    sizes = [base] * parts
    sizes[-1] += total - base * parts
    return sizes


def result_fields(text):
    line = next((l for l in text.splitlines() if l.startswith("result ")), None)
    if line is None:
        return None
    return {k: v for k, v in (f.split("=", 1) for f in line.split()[1:])}


def start_proxies(bins, exec_ns, store_port, n, gather, tmp, hosts, ports):
    """store_proxy_host processes for n ranks' nodes (appended to hosts), their ports to ports."""
    nodes = math.ceil(n / RANKS_PER_NODE)
    for i, count in enumerate(chunks(nodes, PROXIES_PER_HOST)):
        pf = tmp / f"proxy-ports-{i}"
        p = subprocess.Popen(
            exec_ns + [bins["store_proxy_host"], "--upstream", f"127.0.0.1:{store_port}",
                       "--proxies", str(count), "--ports-file", str(pf)] + gather,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        hosts.append(p)
        if p.stdout.readline().strip() != "ready":
            raise SystemExit("store_proxy_host did not start")
        ports += pf.read_text().split()


def run_generators(bins, exec_ns, store_port, n, proxy_ports, tmp):
    """The storm's n ranks from store_loadgen processes, to the store or (proxy_ports) each
    node's ranks to its proxy; their result fields."""
    gens, offset = [], 0
    for i, count in enumerate(chunks(n, CLIENTS_PER_GENERATOR)):
        cmd = exec_ns + [bins["store_loadgen"], "--scenario", "storm", "--dialect", "2",
                         "--conns", str(count), "--threads", "1", "--sources", "16",
                         "--rank-offset", str(offset), "--world", str(n), "--tag", "a"]
        if proxy_ports is not None:
            pf = tmp / f"gen-ports-{i}"
            first = offset // RANKS_PER_NODE
            last = math.ceil((offset + count) / RANKS_PER_NODE)
            pf.write_text("\n".join(proxy_ports[first:last]) + "\n")
            cmd += ["--ports-file", str(pf), "--per-port", str(RANKS_PER_NODE)]
        else:
            cmd += ["--port", str(store_port)]
        gens.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True))
        offset += count
    results = []
    for g in gens:
        out, err = g.communicate(timeout=900)
        r = result_fields(out)
        if r is None:
            raise SystemExit(f"store_loadgen failed:\n{out}{err}")
        results.append(r)
    return results


def storm(bins, server_class, netns_class, kind, n, via_proxy, gather_us=None):
    """One storm of n ranks against a fresh `kind` server, through proxies or not (gathering
    for gather_us, ProxyOptions::gather's default if None)."""
    gather = [] if gather_us is None else ["--gather-us", str(gather_us)]
    with netns_class() as ns, tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        server = server_class(kind, bins, netns=ns.name)
        hosts, ports = [], []
        try:
            exec_ns = ["ip", "netns", "exec", ns.name]
            if via_proxy:
                start_proxies(bins, exec_ns, server.port, n, gather, tmp, hosts, ports)
            cpu0 = server.cpu_seconds()
            host_cpu0 = sum(cpu_seconds(h.pid) for h in hosts)
            results = run_generators(bins, exec_ns, server.port, n, ports if via_proxy else None,
                                     tmp)
            row = {
                "seconds": max(float(r["seconds"]) for r in results),
                "failed": sum(int(r["failed"]) for r in results),
                "completed": sum(int(r["completed"]) for r in results),
                "server_cpu": server.cpu_seconds() - cpu0,
                "store_conns": len(ports) if via_proxy else n,
                "proxy_cpu": sum(cpu_seconds(h.pid) for h in hosts) - host_cpu0,
            }
            client_requests = upstream = 0
            for h in hosts:
                h.terminate()
                out, _ = h.communicate(timeout=120)
                r = result_fields(out) or {}
                client_requests += int(r.get("client_requests", 0))
                upstream += int(r.get("upstream_requests", 0))
            hosts = []
            row["client_requests"] = client_requests
            row["upstream_requests"] = upstream
            return row
        finally:
            for h in hosts:
                h.kill()
                h.wait()
            server.stop()


def proxy_rows(bins, server_class, netns_class, sizes, rounds, gather_us=None):
    """For each size: ddpstore direct (while the store's descriptors allow), ddpstore through
    proxies, and torch 2.x's libuv server direct at sizes up to 16,384; rounds alternate."""
    rows, errors = [], 0
    for n in sizes:
        modes = [("ours", True)]
        if n <= CLIENTS_PER_GENERATOR:
            modes = [("ours", False), ("ours", True), ("torch2", False)]
        runs = {m: [] for m in modes}
        for r in range(rounds):
            for mode in (modes if r % 2 == 0 else list(reversed(modes))):
                runs[mode].append(storm(bins, server_class, netns_class, mode[0], n, mode[1],
                                        gather_us))
        med = {}
        for mode, rs in runs.items():
            mid = sorted(rs, key=lambda x: x["seconds"])[len(rs) // 2]
            med[mode] = dict(mid, failed=sum(x["failed"] for x in rs),
                             server_cpu=sorted(x["server_cpu"] for x in rs)[len(rs) // 2])
            errors += med[mode]["failed"]
        rows.append((n, med))
        print(f"  proxy storm {n:>7,}: " + ", ".join(
            f"{k}{' via proxies' if p else ''} {v['seconds']:.3f} s" for (k, p), v in med.items()),
            flush=True)
    return rows, errors


def print_proxy_rows(rows, rounds):
    names = {("ours", False): "ddpstore", ("ours", True): "ddpstore + proxies",
             ("torch2", False): "torch 2.x libuv"}
    print(f"\ninit storm through store proxies (8 ranks per node, one proxy per node), 2.x "
          f"dialect, store, proxies and generators in one namespace with only loopback "
          f"(median of {rounds})")
    print(f"{'ranks':>7} {'server':>20} {'wall s':>8} {'store CPU s':>12} "
          f"{'store CPU us/rank':>18} {'conns/rank':>11} {'requests/rank':>14} "
          f"{'proxies CPU s':>14} {'failed':>7}")
    for n, med in rows:
        # Without proxies the store gets every request the clients send (counted by the proxies
        # in the proxied run of the same storm).
        sent = med[("ours", True)]["client_requests"] / n
        for mode, v in med.items():
            proxied = mode[1]
            per_rank = v["upstream_requests"] / n if proxied else sent
            print(f"{n:>7,} {names[mode]:>20} {v['seconds']:8.3f} {v['server_cpu']:12.3f} "
                  f"{1e6 * v['server_cpu'] / n:18.1f} {v['store_conns'] / n:11.3f} "
                  f"{'-' if per_rank is None else f'{per_rank:.2f}':>14} "
                  f"{v['proxy_cpu'] if proxied else 0:14.2f} {v['failed']:>7}")
