#!/usr/bin/env python3
"""Comments, docs and help text speak about the code as it is.

Two checks over the tracked text files (source, scripts, docs), the
history records left out (CHANGELOG.md, docs/measurements/):

- history words: a mention of the work's history instead of the code
  ("issue 24", "seed 002", "an earlier session", "stop 3", a Markdown
  heading "Round 4", the name of a git branch). Words the code itself
  uses are not flagged: a migration's pre-copy rounds ("round 0"), a TLS
  session, a vCPU's stop.
- paths: every repository path named in a comment or a doc exists
  (`crates/s2mmu/src/mmu/tests/bounds.rs`, `tests/el1/boot.rs` in a
  crate, `docs/layout.md`, a Markdown file named alone). A path is looked
  up from the repository root, from the naming file's crate and folder,
  and in every crate; globs and `{a,b}` groups are expanded.

Every finding is printed as FILE:LINE: what; the run fails when there is
one. Usage: .ci/doc_words.py [--history | --paths] (both by default);
.ci/doc_words.py --selftest shows each check fails on a planted word or
path and passes on real code."""
import os
import re
import subprocess
import sys
import tempfile

# History records, and files whose text is data, not prose.
EXEMPT = (
    re.compile(r"^CHANGELOG\.md$"),
    re.compile(r"(^|/)CHANGELOG\.md$"),
    re.compile(r"^docs/measurements/"),
    re.compile(r"^api/"),
    re.compile(r"\.lock$"),
    re.compile(r"^\.ci/doc_words\.py$"),
)
TEXT = (".rs", ".md", ".py", ".sh", ".toml", ".c", ".h", ".S", ".s", ".ld", ".yml", ".txt")
TEXT_NAMES = ("run",)

HISTORY = [
    (re.compile(r"\bissues?\s+#?\d+", re.I), "names an issue"),
    (re.compile(r"\bseeds?\s+0\d\d\b", re.I), "names a seed"),
    (re.compile(r"\b(?:last|previous|earlier|today's|yesterday's)\s+session\b", re.I), "names a session of work"),
    (re.compile(r"\bsession\s+\d+\b", re.I), "names a session of work"),
    (re.compile(r"\b(?:this|last|previous|earlier|next)\s+sitting\b", re.I), "names a sitting"),
    (re.compile(r"\bstop\s+\d+\b", re.I), "names a stop of the work"),
    (re.compile(r"\b(?:at|by|before|after|in)\s+this\s+stop\b", re.I), "names a stop of the work"),
    (re.compile(r"^\s*#+\s.*\bRound\s+\d+\b"), "a heading names a round of work"),
    (re.compile(r"\b(?:this|last|previous|next)\s+round\s+of\s+(?:work|the\s+plan)\b", re.I), "names a round of work"),
]
# Where a seed's number is the subject, not history: `s2mmu reproduce`
# reruns the seeds' experiments and titles each section by its seed.
SEED_HOME = re.compile(r"^crates/s2mmu-cli/src/reproduce(\.rs$|/)")
# Branch names that are ordinary words the code uses are not flagged.
ORDINARY = {"main", "master", "flags", "hostile", "HEAD"}

# A path in prose: a relative path with a folder, or a file named alone
# with an extension a repository file has.
PATH_RE = re.compile(
    r"(?<![\w./:@~$-])((?:\.ci|[A-Za-z_][\w-]*)(?:/[\w.*{},-]+)+\.(?:rs|md|py|sh|toml|txt|S|c|h|ld|json))(?![\w/-])"
    r"|(?<![\w./:@~$-])((?:crates|docs|scripts|fuzz|api|\.ci)/[\w.*{},/-]*[\w*}])(?![\w./-])"
)
BARE_MD = re.compile(r"(?<![\w./:@~$-])([A-Z][\w-]*\.md)\b")


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True, check=True)
    return [f for f in out.stdout.splitlines() if os.path.isfile(os.path.join(root, f))]


def wanted(f):
    if any(p.search(f) for p in EXEMPT):
        return False
    return f.endswith(TEXT) or os.path.basename(f) in TEXT_NAMES


def code_words(root, files):
    """Every name the Rust code uses outside comments: a branch named like
    one of them (`flags`, `stats`) is an ordinary word here."""
    words = set()
    for f in files:
        if f.endswith(".rs"):
            for line in open(os.path.join(root, f), encoding="utf-8", errors="replace"):
                words.update(re.findall(r"\w+", line.split("//")[0]))
    return words


def branches(root, files):
    out = subprocess.run(
        ["git", "-C", root, "for-each-ref", "--format=%(refname:lstrip=-1)", "refs/heads", "refs/remotes"],
        capture_output=True, text=True,
    )
    ordinary = ORDINARY | code_words(root, files)
    names = {n for n in out.stdout.split() if n not in ordinary and len(n) >= 4}
    return [re.compile(r"(?<![\w/.-])" + re.escape(n) + r"(?![\w/.-])") for n in sorted(names)]


def prose(f, line):
    """The part of a line these checks read: all of it. Code has no
    spaces inside a name, so a phrase such as "issue 24" is in a comment,
    a doc or a string (help text) wherever it stands; a Markdown heading
    rule applies to Markdown only."""
    return line


def history(root, files, out):
    names = branches(root, files)
    n = 0
    for f in files:
        for i, line in enumerate(open(os.path.join(root, f), encoding="utf-8", errors="replace"), 1):
            text = prose(f, line)
            if not text:
                continue
            for pat, what in HISTORY:
                if pat.pattern.startswith("^") and not f.endswith(".md"):
                    continue
                if what == "names a seed" and SEED_HOME.search(f):
                    continue
                m = pat.search(text)
                if m:
                    print(f"{f}:{i}: {what}: {m.group(0).strip()!r}", file=out)
                    n += 1
            for pat in names:
                m = pat.search(text)
                if m:
                    print(f"{f}:{i}: names the branch {m.group(0)!r}", file=out)
                    n += 1
    return n


def expand(p):
    """`a/{b,c}.rs` -> `a/b.rs`, `a/c.rs`."""
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    out = []
    for alt in m.group(1).split(","):
        out += expand(p[: m.start()] + alt.strip() + p[m.end():])
    return out


# The first folders of a path that is this repository's (or that claims a
# file of the workplace the repository does not hold); a path starting
# elsewhere with a C or other extension names another project's file (the
# kernel's `arch/arm64/kvm/psci.c`, libc's `sys/mman.h`) and is not looked up.
OURS = ("crates", "docs", "scripts", "fuzz", "api", ".ci", "shared", "src", "tests",
        "examples", "benches", "asm", "guest", "image")
# Selftests whose sample trees name files that exist only in a temporary folder.
PATHS_EXEMPT = (".ci/import_dag.py", ".ci/folder_sizes.py", "scripts/check_doc_links.py",
                "scripts/check_doc_move.py")


def checked(p):
    """Whether p is a path of this repository to look up: not a glob, not
    a placeholder (`api/CRATE.txt`, `OUTDIR/x.json`), and either one of
    ours by its first folder or a Rust or Markdown file."""
    if "*" in p:
        return False
    segs = p.split("/")
    if any(re.fullmatch(r"[A-Z][A-Z0-9_]+", x.split(".")[0]) for x in segs[:-1]) or (
        len(segs) > 1 and re.fullmatch(r"[A-Z][A-Z0-9_]+", segs[-1].split(".")[0])
    ):
        return False
    return segs[0] in OURS or p.endswith((".rs", ".md"))


def exists(p, known):
    """p names a tracked file or folder: from the root, or as the end of
    one's path (`tests/el1/boot.rs` in its crate, `dest/guest.rs` beside
    its module)."""
    p = p.rstrip(".,").rstrip("/")
    for cand in expand(p):
        if cand in known["all"]:
            return True
        if "/" not in cand:
            if cand in known["base"]:
                return True
            continue
        if any(x.endswith("/" + cand) for x in known["all"]):
            return True
    return False


def paths(root, files, out):
    every = tracked(root)
    known = {"all": set(every), "base": {os.path.basename(x) for x in every}}
    for f in every:
        d = os.path.dirname(f)
        while d:
            known["all"].add(d)
            d = os.path.dirname(d)
    n = 0
    for f in files:
        if f in PATHS_EXEMPT:
            continue
        for i, line in enumerate(open(os.path.join(root, f), encoding="utf-8", errors="replace"), 1):
            text = prose(f, line)
            found = [a or b for a, b in PATH_RE.findall(text)] + BARE_MD.findall(text)
            for p in found:
                if "://" in p or p.startswith(("target/", "/")) or not checked(p):
                    continue
                if not exists(p, known):
                    print(f"{f}:{i}: names {p!r}, which does not exist", file=out)
                    n += 1
    return n


def run(root, which, out=sys.stdout):
    files = [f for f in tracked(root) if wanted(f)]
    n = 0
    if which in ("both", "history"):
        n += history(root, files, out)
    if which in ("both", "paths"):
        n += paths(root, files, out)
    if n:
        print(f"{n} finding(s): say what the code does (history goes to CHANGELOG.md and "
              "docs/measurements/), and name only paths that exist", file=out)
    return 1 if n else 0


def write_tree(d, files):
    """Writes each of `files` (a path under `d`: its text), folders made as needed."""
    for f, t in files.items():
        os.makedirs(os.path.dirname(os.path.join(d, f)), exist_ok=True)
        open(os.path.join(d, f), "w").write(t)


def selftest():
    quiet = open(os.devnull, "w")
    with tempfile.TemporaryDirectory() as d:
        git = lambda *a: subprocess.run(["git", "-C", d, *a], capture_output=True, check=True)
        git("init", "-q", "-b", "main")
        real = {
            "crates/x/src/lib.rs": "//! Round 0 sends every page; the TLS session's exporter.\n"
                                   "//! The vCPU's last stop; see `src/lib.rs` and `docs/a.md`.\n"
                                   "pub fn stop(session: u32) -> u32 { session }\n",
            "docs/a.md": "# Pre-copy\nround 2 converges; see [lib](../crates/x/src/lib.rs) and README.md.\n",
            "README.md": "The crates: `crates/x/src/{lib}.rs`.\n",
            "docs/measurements/m.md": "issue 41, seed 002, session 3: history is kept here.\n",
            "CHANGELOG.md": "- issue 41: history is kept here too.\n",
        }
        write_tree(d, real)
        git("add", "-A")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t")
        assert run(d, "both", quiet) == 0, "real code and history records were flagged"
        for planted in ("// fixed in issue 12\n", "/// seed 003's baseline\n",
                        "// as the previous session left it\n", "// TODO before stop 4\n"):
            open(os.path.join(d, "crates/x/src/p.rs"), "w").write(planted)
            git("add", "-A")
            assert run(d, "history", quiet) == 1, f"planted {planted!r} was not found"
        open(os.path.join(d, "crates/x/src/p.rs"), "w").write('"s2mmu: see help" // fine\n')
        git("add", "-A")
        git("branch", "wirefix")
        open(os.path.join(d, "docs/b.md"), "w").write("As wirefix measured.\n")
        git("add", "-A")
        assert run(d, "history", quiet) == 1, "a branch name was not found"
        os.remove(os.path.join(d, "docs/b.md"))
        git("add", "-A")
        assert run(d, "both", quiet) == 0
        open(os.path.join(d, "docs/b.md"), "w").write("See `docs/incoming/wire6.md` and DESIGN.md.\n")
        git("add", "-A")
        buf = tempfile.TemporaryFile("w+")
        assert run(d, "paths", buf) == 1, "a missing path was not found"
        buf.seek(0)
        text = buf.read()
        assert "wire6.md" in text and "DESIGN.md" in text, text
    print("doc_words selftest: planted history words, a branch name and missing paths fail; real code passes")
    return 0


def main(argv):
    if argv[1:] == ["--selftest"]:
        return selftest()
    which = "both"
    if "--history" in argv:
        which = "history"
    if "--paths" in argv:
        which = "paths"
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True).stdout.strip() or "."
    return run(root, which)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
