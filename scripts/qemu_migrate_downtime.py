#!/usr/bin/env python3
"""QEMU's own live migration of the guest `s2mmu migrate --guest linux` moves.

The independent reference for that command's downtime: the same Debian
arm64 kernel and the project's initramfs (`s2mmu.run=counter`, the default
`--linux-run`), the same RAM and, by default, the same 2 vCPUs, booted by
QEMU alone as `s2mmu linux --vs-qemu` boots it (TCG, `-M virt,gic-version=3
-cpu max`, EL1, no stage 2), migrated by QEMU's own pre-copy between two QEMU
processes over TCP on this host.

Each run: a destination QEMU waiting with `-incoming`, a source QEMU booted
until the counter's first line, then QMP `migrate`; `query-migrate`'s
`downtime` (QEMU's own figure: from the source's stop to the migration's
completion on the source, ms), `total-time`, and `stop_to_resume_ms`: from
the source's STOP event to the destination's RESUME event (QMP timestamps,
one host clock), the span `s2mmu migrate` reports as downtime (pause on the
source to the destination's first guest instruction), and a check that the
destination's console goes on counting from where the source stopped.

Usage: scripts/qemu_migrate_downtime.py [--mem-mib 1024] [--runs 5] [--vcpus 2] [--json]
The kernel and initramfs come from the asset cache (`scripts/setup.sh`).
"""

import argparse
import glob
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CACHE = os.environ.get("S2MMU_LINUX_CACHE") or os.path.expanduser("~/.cache/s2mmu/linux")
COUNTER = re.compile(rb"s2mmu-counter: n=(\d+)")


def assets():
    image = sorted(glob.glob(os.path.join(CACHE, "kernel-*", "Image")))
    initrd = sorted(glob.glob(os.path.join(CACHE, "initramfs-*.cpio.gz")), key=os.path.getmtime)
    if not image or not initrd:
        sys.exit(f"no kernel or initramfs under {CACHE}: run scripts/setup.sh")
    return image[-1], initrd[-1]


class Qmp:
    def __init__(self, path, deadline):
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX)
                self.s.settimeout(30)
                self.s.connect(path)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        self.f = self.s.makefile("rwb")
        self.events = []
        json.loads(self.f.readline())  # greeting
        self.cmd("qmp_capabilities")

    def event_time(self, name, deadline):
        """The host time (s) of the first event `name`, waiting for it."""
        while True:
            for e in self.events:
                if e["event"] == name:
                    t = e["timestamp"]
                    return t["seconds"] + t["microseconds"] / 1e6
            if time.time() > deadline:
                raise RuntimeError(f"no {name} event")
            self.cmd("query-status")  # reads events that came meanwhile
            time.sleep(0.01)

    def cmd(self, name, **args):
        msg = {"execute": name}
        if args:
            msg["arguments"] = args
        self.f.write(json.dumps(msg).encode() + b"\n")
        self.f.flush()
        while True:
            r = json.loads(self.f.readline())
            if "event" in r:
                self.events.append(r)
                continue
            if "error" in r:
                raise RuntimeError(f"{name}: {r['error']}")
            return r["return"]


def qemu(image, initrd, mem_mib, vcpus, qmp, serial, incoming=None):
    args = ["qemu-system-aarch64", "-M", "virt,gic-version=3", "-cpu", "max,pauth-impdef=on",
            "-smp", str(vcpus), "-m", f"{mem_mib}M", "-display", "none", "-no-reboot",
            "-kernel", image, "-initrd", initrd,
            "-append", "console=ttyAMA0 quiet s2mmu.run=counter",
            "-serial", f"file:{serial}", "-qmp", f"unix:{qmp},server=on,wait=off",
            "-monitor", "none"]
    if incoming:
        args += ["-incoming", incoming]
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def counters(path):
    try:
        with open(path, "rb") as f:
            return [int(m) for m in COUNTER.findall(f.read())]
    except FileNotFoundError:
        return []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(image, initrd, mem_mib, vcpus, tmp, i):
    port = free_port()
    paths = {k: os.path.join(tmp, f"{k}{i}") for k in ("sq", "dq", "sc", "dc")}
    dst = qemu(image, initrd, mem_mib, vcpus, paths["dq"], paths["dc"], f"tcp:127.0.0.1:{port}")
    src = qemu(image, initrd, mem_mib, vcpus, paths["sq"], paths["sc"])
    try:
        deadline = time.time() + 120
        sq = Qmp(paths["sq"], deadline)
        dq = Qmp(paths["dq"], deadline)
        while not counters(paths["sc"]):
            if time.time() > deadline or src.poll() is not None:
                raise RuntimeError("the source guest's counter never started")
            time.sleep(0.1)
        # No bandwidth cap (QEMU 7.2's default is 128 MiB/s): as fast as the
        # link and the CPUs go, as `s2mmu migrate` runs unpaced.
        sq.cmd("migrate-set-parameters", **{"max-bandwidth": 1 << 40})
        sq.cmd("migrate", uri=f"tcp:127.0.0.1:{port}")
        while True:
            st = sq.cmd("query-migrate")
            if st.get("status") in ("completed", "failed", "cancelled"):
                break
            if time.time() > deadline:
                raise RuntimeError(f"migration did not finish: {st.get('status')}")
            time.sleep(0.01)
        if st["status"] != "completed":
            raise RuntimeError(f"migration {st['status']}: {st.get('error-desc')}")
        last_src = max(counters(paths["sc"]) or [0])
        while True:
            seen = counters(paths["dc"])
            if seen:
                break
            if time.time() > deadline:
                raise RuntimeError("the destination's console never counted")
            time.sleep(0.1)
        status = dq.cmd("query-status")["status"]
        stop = sq.event_time("STOP", deadline)
        resume = dq.event_time("RESUME", deadline)
        return {
            "downtime_ms": st["downtime"],
            "stop_to_resume_ms": round((resume - stop) * 1e3, 3),
            "total_ms": st["total-time"],
            "setup_ms": st.get("setup-time"),
            "ram_transferred_bytes": st["ram"]["transferred"],
            "ram_mbps": st["ram"].get("mbps"),
            "dest_status": status,
            "source_last": last_src,
            "dest_first": seen[0],
            "continued": seen[0] == last_src + 1,
        }
    finally:
        for p in (src, dst):
            p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mem-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--vcpus", type=int, default=2,
                    help="guest CPUs (s2mmu migrate --guest linux's default is 2)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not 128 <= a.mem_mib <= 4096 or not 1 <= a.runs <= 20 or not 1 <= a.vcpus <= 8:
        sys.exit("--mem-mib 128..4096, --runs 1..20, --vcpus 1..8")
    image, initrd = assets()
    runs = []
    with tempfile.TemporaryDirectory(prefix="qemu-mig-") as tmp:
        for i in range(a.runs):
            runs.append(one_run(image, initrd, a.mem_mib, a.vcpus, tmp, i))
            if not a.json:
                r = runs[-1]
                print(f"run {i + 1}: downtime {r['downtime_ms']} ms (stop to resume "
                      f"{r['stop_to_resume_ms']} ms), total {r['total_ms']} ms, "
                      f"{r['ram_transferred_bytes'] / 2**20:.0f} MiB sent, destination {r['dest_status']}, "
                      f"counter {r['source_last']} -> {r['dest_first']}")
    down = [r["downtime_ms"] for r in runs]
    span = [r["stop_to_resume_ms"] for r in runs]
    out = {"qemu": subprocess.run(["qemu-system-aarch64", "--version"], capture_output=True,
                                  text=True).stdout.splitlines()[0],
           "mem_mib": a.mem_mib, "vcpus": a.vcpus, "runs": runs, "downtime_ms_median": statistics.median(down),
           "downtime_ms_min": min(down), "downtime_ms_max": max(down),
           "stop_to_resume_ms_median": statistics.median(span),
           "stop_to_resume_ms_min": min(span), "stop_to_resume_ms_max": max(span),
           "all_continued": all(r["continued"] for r in runs)}
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"QEMU's own migration, {a.vcpus} vCPUs, {a.mem_mib} MiB, {a.runs} runs: downtime median "
              f"{out['downtime_ms_median']} ms ({out['downtime_ms_min']}-{out['downtime_ms_max']}), "
              f"stop to resume median {out['stop_to_resume_ms_median']} ms "
              f"({out['stop_to_resume_ms_min']}-{out['stop_to_resume_ms_max']}); "
              f"every destination went on counting: {out['all_continued']}")


if __name__ == "__main__":
    main()
