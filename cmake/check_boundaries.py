#!/usr/bin/env python3
"""Fails (exit 1, one line per offence) when a file of one component includes a header of
another component that the other does not declare public (ddprun_public_headers() in its
CMakeLists.txt), or includes a component it must not depend on at all. Run by the build
(target check_boundaries, part of ALL), so a boundary is a build error, not a convention.

usage: check_boundaries.py ROOT STAMP COMPONENT=DEPS... -- PUBLIC_HEADER...
  COMPONENT=DEPS: "launcher=agent,store": launcher may include agent's and store's public
  headers. PUBLIC_HEADER: a path from ROOT ("agent/agent.hpp"); a path ending in "/" makes
  every header below it public ("store/sys/").
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main(argv):
    root, stamp = pathlib.Path(argv[1]), pathlib.Path(argv[2])
    split = argv.index("--")
    deps = {}
    for spec in argv[3:split]:
        name, _, allowed = spec.partition("=")
        deps[name] = [d for d in allowed.split(",") if d]
    public = argv[split + 1:]

    def is_public(header):
        return any(header == p or (p.endswith("/") and header.startswith(p)) for p in public)

    offences = []
    for component, allowed in deps.items():
        for path in sorted((root / component).rglob("*")):
            if path.suffix not in (".cpp", ".hpp", ".h", ".cc") or "/bench/" in str(path):
                continue
            for header in INCLUDE.findall(path.read_text(errors="replace")):
                owner = header.split("/", 1)[0]
                if owner == component or owner not in deps:
                    continue
                where = path.relative_to(root)
                if owner not in allowed:
                    offences.append(f"{where}: includes {header}: {component} must not depend "
                                    f"on {owner}")
                elif not is_public(header):
                    offences.append(f"{where}: includes {header}, which {owner} does not "
                                    f"declare public (ddprun_public_headers in "
                                    f"{owner}/CMakeLists.txt)")
    if offences:
        print("\n".join(offences), file=sys.stderr)
        return 1
    stamp.write_text("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
