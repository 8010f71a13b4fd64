#!/usr/bin/env python3
"""Run the workspace's test binaries a few at a time, longest first.

    scripts/run-tests.py [--jobs N] [--durations FILE]

`cargo test` runs its test binaries one after another, and most of ours
spend their time waiting on servers (a lease running out, a member
restarting, a 30 s window of an idle fleet), not on the CPU: the suite's
wall time was the sum of ~90 binaries' times. This runs the same binaries,
built by the same `cargo test --workspace --all-features --no-run`, with
`--jobs` of them at once (default 3, or TEST_JOBS), plus the doctests as
one more job. Each binary still runs its own tests on its usual threads,
in its package's directory, with the environment `cargo test` gives it.

Order: longest first, by the times the last run wrote to --durations
(default: test-durations.json in the target directory), so the slowest
binary never starts last. A binary's output is printed only when it fails;
every binary gets one line with its time. At the end: the slowest five,
the wall time, and every failure by name. Exit status 1 if anything
failed, 2 if the build did.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

CARGO = os.environ.get("CARGO", "cargo")


def build():
    """Builds every test target; returns [(name, kind, manifest dir, exe)]."""
    cmd = [CARGO, "test", "--workspace", "--all-features", "--no-run",
           "--message-format=json-render-diagnostics"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    found = []
    for line in proc.stdout:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact":
            continue
        exe = msg.get("executable")
        if not exe or not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        found.append((target["name"], target["kind"][0],
                      os.path.dirname(msg["manifest_path"]), exe))
    if proc.wait() != 0:
        sys.exit(2)
    return found


def target_dir():
    out = subprocess.run([CARGO, "metadata", "--format-version=1", "--no-deps"],
                         stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout)["target_directory"]


def run(job, logdir):
    """Runs one job; returns (label, seconds, exit status, log path)."""
    label, cwd, argv = job
    log = os.path.join(logdir, label.replace("/", "_") + ".log")
    env = dict(os.environ)
    env["CARGO_MANIFEST_DIR"] = cwd
    start = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.call(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                             env=env)
    return label, time.monotonic() - start, rc, log


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int,
                        default=int(os.environ.get("TEST_JOBS", "3")))
    parser.add_argument("--durations")
    args = parser.parse_args()
    if args.jobs < 1:
        sys.exit("run-tests: --jobs must be at least 1")

    binaries = build()
    durations_file = args.durations or os.path.join(target_dir(),
                                                    "test-durations.json")
    try:
        with open(durations_file) as f:
            last = json.load(f)
    except (OSError, ValueError):
        last = {}

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    jobs = [(f"{name} ({kind})", cwd, [exe]) for name, kind, cwd, exe in binaries]
    jobs.append(("doctests", root,
                 [CARGO, "test", "--workspace", "--all-features", "--doc"]))
    # Longest first; a binary never timed goes first too (it may be long).
    jobs.sort(key=lambda j: -last.get(j[0], 1e9))

    times, failed = {}, []
    wall = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="run-tests-") as logdir, \
            ThreadPoolExecutor(max_workers=args.jobs) as pool:
        running = [pool.submit(run, job, logdir) for job in jobs]
        for done in as_completed(running):
            label, secs, rc, log = done.result()
            times[label] = secs
            if rc == 0:
                print(f"ok     {secs:7.1f} s  {label}", flush=True)
                continue
            failed.append(label)
            print(f"FAILED {secs:7.1f} s  {label} (exit {rc}); its output:",
                  flush=True)
            with open(log) as f:
                sys.stdout.write(f.read())
            print(f"------ end of {label}", flush=True)
    wall = time.monotonic() - wall

    try:
        with open(durations_file, "w") as f:
            json.dump(times, f, indent=1, sort_keys=True)
    except OSError as err:
        print(f"run-tests: could not keep the durations: {err}", file=sys.stderr)

    slowest = sorted(times.items(), key=lambda t: -t[1])[:5]
    print(f"\n{len(times)} jobs, {args.jobs} at a time: {wall:.0f} s wall, "
          f"{sum(times.values()):.0f} s summed. Slowest:")
    for label, secs in slowest:
        print(f"  {secs:7.1f} s  {label}")
    if failed:
        print("\nfailed: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
