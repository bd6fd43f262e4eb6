"""Move recordings from the module hash (schema 1) to the closure fingerprint (schema 2), and prove it was safe.

Until commit 373427e a recording's ``code_hash`` hashed its experiment's whole module, the timer and the kernel
files the module named. A recording that was fresh under that hash was measured by the code that is still
there, so the closure fingerprint of that same code (:mod:`gpulab.core.provenance`) can be stamped onto it without
running it again. This tool does that once, keeping the old hash and the commit it was checked at under
``provenance.stamped``; with ``--check`` (the test suite runs it) it shows that every stamped recording was
fresh: it extracts the package as it was at that commit and recomputes the old hash there.

    python tools/stamp_fingerprints.py --from-commit 373427e   # stamp (once, in the commit that moves to schema 2)
    python tools/stamp_fingerprints.py --check                 # verify the stamped recordings
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"

# Run inside the package as it was at the stamped commit: its own results.code_hash, for each "module:qualname".
OLD_HASHES = """
import importlib, json, sys
from gpulab import results
hashes = {}
for function in json.loads(sys.argv[1]):
    module, _, qualname = function.partition(":")
    fn = importlib.import_module(module)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    hashes[function] = results.code_hash(fn)
print(json.dumps(hashes))
"""


def module_hashes(commit: str, functions: list[str]) -> dict[str, str]:
    """The schema-1 code hash of each experiment function, computed by the package as it was at ``commit``."""
    with tempfile.TemporaryDirectory() as folder:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src/gpulab"], capture_output=True,
                                 check=False)
        if archive.returncode:
            raise SystemExit(f"git archive {commit}: {archive.stderr.decode().strip()} (is the history cloned?)")
        subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
        out = subprocess.run([sys.executable, "-c", OLD_HASHES, json.dumps(sorted(set(functions)))],
                             capture_output=True, text=True, check=False,
                             env={**os.environ, "PYTHONPATH": f"{folder}/src", "GPULAB_KERNELS": "simulator"})
        if out.returncode:
            raise SystemExit(f"the package at {commit} could not hash its experiments:\n{out.stderr}")
        return json.loads(out.stdout)


def recordings() -> list[tuple[Path, dict]]:
    return [(path, json.loads(path.read_text())) for path in sorted(RESULTS.glob("*/*.json"))]


def stamp(commit: str) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from gpulab.core import provenance

    found = [(path, data) for path, data in recordings() if data.get("schema") == 1]
    old = module_hashes(commit, [data["function"] for _, data in found])
    experiments = provenance.package_source().experiments()
    for path, data in found:
        if old[data["function"]] != data["provenance"]["code_hash"]:
            raise SystemExit(f"{path.relative_to(ROOT)} was stale at {commit}: its code had changed; re-record it")
        definition, _ = experiments[data["experiment"]]
        fingerprint = provenance.fingerprint(definition.module, definition.name)
        module_hash = data["provenance"].pop("code_hash")
        data["provenance"]["code"] = fingerprint.as_dict()
        data["provenance"]["stamped"] = {"from_commit": commit, "module_hash": module_hash}
        data["schema"] = 2
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"stamped {path.relative_to(ROOT)}: {fingerprint.hash}")
    return 0


def check() -> int:
    by_commit: dict[str, list[tuple[Path, dict]]] = defaultdict(list)
    for path, data in recordings():
        if "stamped" in data["provenance"]:
            by_commit[data["provenance"]["stamped"]["from_commit"]].append((path, data))
    wrong = []
    for commit, stamped in by_commit.items():
        old = module_hashes(commit, [data["function"] for _, data in stamped])
        wrong += [f"{path.relative_to(ROOT)}: stamped from {data['provenance']['stamped']['module_hash']}, but at "
                  f"{commit} its code hashed to {old[data['function']]}"
                  for path, data in stamped if old[data["function"]] != data["provenance"]["stamped"]["module_hash"]]
    print(f"{sum(map(len, by_commit.values()))} stamped recordings checked at {', '.join(by_commit) or 'no commit'}")
    print("\n".join(wrong) or "each was fresh under the module hash when it was stamped")
    return 1 if wrong else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-commit", help="stamp the schema-1 recordings, checked fresh at this commit")
    parser.add_argument("--check", action="store_true", help="verify every stamped recording")
    args = parser.parse_args()
    if args.check == bool(args.from_commit):
        parser.error("give one of --from-commit COMMIT and --check")
    return check() if args.check else stamp(args.from_commit)


if __name__ == "__main__":
    sys.exit(main())
