#!/usr/bin/env python3
"""Where a Linux migration's round 0 spends CPU, per thread.

usage: scripts/linux_round0_cpu.py BIN OUTDIR [migrate args...]
  (default args: --bandwidth 100M, so that round 0 lasts about 9 s)

Starts BIN migrate --guest linux --linux-run fill --mem 1G -v 1 --channels 1
--json; samples /proc/PID/task/*/stat of s2mmu and of both QEMUs every 50 ms
(OUTDIR/samples.jsonl) and each source CPU's mailbox counters, read out of
the source QEMU's RAM mapping through /proc/QEMU/mem (idle waits, exits,
exit sequence, park ticks, command sequence). Round 0 starts when the
source's service CPU takes its first command (the log's write protection).
0.3 s later it writes a clean WINDOW_S (default 2) second window of
per-thread CPU-seconds per second and the mailbox counters to
OUTDIR/window.json, then (unless NOTRACE=1) runs strace -f -c on the source
QEMU, perf record -e cpu-clock -g on it and strace -c on our vCPU host
thread, WINDOW_S each. Needs root (ptrace, /proc/PID/mem) and the release
binary; the figures are the machine's: say its load.
"""
import json, os, subprocess, sys, time

BIN, OUT = sys.argv[1], sys.argv[2]
extra = sys.argv[3:]
os.makedirs(OUT, exist_ok=True)
HZ = os.sysconf("SC_CLK_TCK")
args = [BIN, "migrate", "--guest", "linux", "--linux-run", "fill", "--mem", "1G", "-v", "1",
        "--channels", "1", "--json", "--io-timeout", "120s"] + (extra or ["--bandwidth", "100M"])
p = subprocess.Popen(args, stdout=open(f"{OUT}/out.json", "w"), stderr=open(f"{OUT}/err.txt", "w"))


def threads(pid):
    r = {}
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                s = open(f"/proc/{pid}/task/{t}/stat").read()
                comm = s[s.index("(") + 1:s.rindex(")")]
                f = s[s.rindex(")") + 2:].split()
                r[int(t)] = (comm, (int(f[11]) + int(f[12])) / HZ)
            except OSError:
                pass
    except OSError:
        pass
    return r


def qemus():
    out = subprocess.run(["pgrep", "-P", str(p.pid), "qemu-system-aar"], capture_output=True,
                         text=True).stdout.split()
    pids = sorted(int(x) for x in out)
    # the source starts first (lower start time); sort by start time
    def start(x):
        try:
            return int(open(f"/proc/{x}/stat").read().rsplit(")", 1)[1].split()[19])
        except OSError:
            return 0
    return sorted(pids, key=start)


def mbox(pid):
    """IDLE_WAITS and STAT_EXITS of each CPU's mailbox, read from QEMU's RAM mapping."""
    try:
        for line in open(f"/proc/{pid}/maps"):
            if "s2mmu-arm64" in line and "elf" not in line:
                start = int(line.split("-")[0], 16)
                r = []
                with open(f"/proc/{pid}/mem", "rb") as m:
                    for cpu in range(2):
                        base = start + 0x201000 + cpu * 0x2000
                        vals = []
                        for off in (0x128, 0xf0, 0x080, 0x1b0, 0x000):
                            m.seek(base + off)
                            vals.append(int.from_bytes(m.read(8), "little"))
                        r.append(vals)
                return r
    except OSError as e:
        return str(e)
    return None


def snap():
    q = qemus()
    d = {"t": time.time(), "s2mmu": threads(p.pid)}
    for i, x in enumerate(q):
        d[f"qemu{i}"] = threads(x)
        d[f"mbox{i}"] = mbox(x)
    return d, q


def diff(a, b, dt):
    res = {}
    for k in b:
        if k == "t" or k.startswith("mbox"):
            continue
        for tid, (comm, c) in b[k].items():
            c0 = a.get(k, {}).get(tid, (comm, c))[1] if tid in a.get(k, {}) else None
            if c0 is None:
                continue
            key = f"{k}:{comm}:{tid}"
            res[key] = (c - c0) / dt
    return res


log = open(f"{OUT}/samples.jsonl", "w")
traced = False
cmd0 = None
WIN = float(os.environ.get("WINDOW_S", "2"))
while p.poll() is None:
    s, q = snap()
    log.write(json.dumps(s) + "\n")
    mb = s.get("mbox0")
    if not traced and len(q) >= 2 and isinstance(mb, list):
        # Round 0 starts with dirty logging: the eager split's and the
        # write protection's invalidations are the source service CPU's
        # first commands (its CMD_SEQ moves).
        seq = mb[-1][4]
        if cmd0 is None:
            cmd0 = seq
        elif seq != cmd0:
            traced = True
            time.sleep(0.3)
            a, _ = snap()
            time.sleep(WIN)
            b, _ = snap()
            rates = diff(a, b, b["t"] - a["t"])
            mbx = {k: [a.get(k), b.get(k)] for k in b if k.startswith("mbox")}
            json.dump({"window_s": b["t"] - a["t"], "rates": rates,
                       "mbox [idle_waits, exits, exit_seq, park, cmd_seq]": mbx},
                      open(f"{OUT}/window.json", "w"), indent=1)
            if os.environ.get("NOTRACE") != "1":
                src = q[0]
                subprocess.run(f"timeout -s INT {WIN} strace -f -c -p {src} -o {OUT}/strace.txt",
                               shell=True)
                subprocess.run(f"perf record -e cpu-clock -g -o {OUT}/perf.data -p {src} -- sleep {WIN}"
                               f" > {OUT}/perf_rec.txt 2>&1", shell=True)
                own = [t for t, (comm, c) in s["s2mmu"].items() if comm.startswith("linux-mig-vcpu")]
                if own:
                    subprocess.run(f"timeout -s INT {WIN} strace -c -p {own[0]} -o {OUT}/strace_vcpu.txt",
                                   shell=True)
    time.sleep(0.05)
log.close()
print("exit", p.returncode)
