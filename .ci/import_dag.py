#!/usr/bin/env python3
"""A crate's modules' import graph is a DAG. Each .rs file is a node; an edge A -> B is a path in A (a `use`, or a
path written in code) that names module B or an item B defines. A path
through a re-export (`pub use`, or a plain `use` the child sees) is
followed to the module that defines the item, so a module root that only
declares and re-exports its children is no edge back from them. A child
that uses an item its parent defines, while the parent uses the child,
is a cycle: shared helpers belong in a module of their own.

The same holds one level up: among the children of a module, a folder (a
module with modules of its own) that imports from a sibling which imports
from it back is a circle even when no two files form one (`a::x` uses
`b::y` while `b::z` uses `a::w`).

Prints every cycle found (one per strongly connected component) and exits
1 when there is any. Test code is no layer: a module declared for tests
only (`#[cfg(test)] mod tests;`, as an inline test module) is left out.

Usage: .ci/import_dag.py --workspace checks every crate of the cargo
workspace (its libraries and binaries, from `cargo metadata`; the few
crates with known cycles are listed in KNOWN, with why);
.ci/import_dag.py [SRC_DIR] checks one crate's folder (default
crates/s2mmu-migrate/src); `--only a,b::c` reports only the cycles through
modules under those paths; `--files-only` leaves the folder-level circles
out; .ci/import_dag.py --selftest shows the check fails on a cycle (file-
or folder-level) and passes without one."""
import json
import os
import re
import subprocess
import sys
import tempfile

ITEM_RE = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+)?(?:const\s+)?(?:async\s+)?"
    r"(?:fn|struct|enum|trait|type|const|static|union|macro_rules!)\s+(\w+)"
)
# A module declared for tests only (`#[cfg(test)] mod tests;`, or
# `#[cfg(all(test, ...))]`): its file is test code, as an inline
# `#[cfg(test)] mod tests { ... }` is.
TEST_MOD_RE = re.compile(
    r"#\[cfg\((?:test|all\(test\b[^\]]*)\)\]\s*(?:#\[[^\]]*\]\s*)*"
    r"(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;"
)
MOD_RE = re.compile(r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
# (Not the stem of a use group, `super::dest::{a, b}`: its leaves count.)
PATH_RE = re.compile(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)(?!\w|::)")
# A path that starts with a name (a child module, or a module the file
# imported: `sender::copy_page`, `postcopy::source::run`).
NAME_PATH_RE = re.compile(r"(?<![\w:])([a-z_]\w*(?:::\w+)+)(?!\w|::)")


def modules(root, root_file=None):
    """Module path (tuple) -> file, for every .rs under root. With
    `root_file` (a crate root in a folder that holds two, `lib.rs` and
    `main.rs`), only the modules its `mod` declarations reach."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)[:-3].split(os.sep)
            if rel[-1] in ("lib", "main", "mod"):
                rel = rel[:-1]
            if rel or root_file is None:
                out[tuple(rel)] = p
    if root_file is None:
        return out
    out[()] = root_file
    reached, todo = {()}, [()]
    while todo:
        m = todo.pop()
        text = re.sub(r"//[^\n]*", "", open(out[m], encoding="utf-8").read())
        for x in re.finditer(MOD_RE.pattern, text, flags=re.M):
            kid = m + (x.group(1),)
            if kid in out and kid not in reached:
                reached.add(kid)
                todo.append(kid)
    return {m: out[m] for m in reached}


def strip_code(text):
    """The text without comments, string literals and `#[cfg(test)]`
    modules (a test module's `use super::*` is no dependency)."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    # `pub(in crate::a)` says who may see an item, not what it uses.
    text = re.sub(r"pub\(in [^)]*\)", "pub(crate)", text)
    # (`#[cfg(all(test, ...))]` is test-only as well; `any(test, ...)` is not.)
    m = re.search(r"#\[cfg\((?:test|all\(test\b[^\]]*)\)\]\s*mod\s+\w+\s*\{", text)
    if m:
        text = text[: m.start()]
    return text


def split_top(s):
    """Splits s at commas outside braces."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def use_leaves(tree, prefix=()):
    """(full path, local name) for each leaf of a use tree."""
    tree = tree.strip()
    m = re.match(r"^(.*?)::\s*\{(.*)\}$", tree, flags=re.S)
    if m:
        base = tuple(x for x in m.group(1).split("::") if x)
        out = []
        for part in split_top(m.group(2)):
            out += use_leaves(part, prefix + base)
        return out
    if tree.startswith("{") and tree.endswith("}"):
        out = []
        for part in split_top(tree[1:-1]):
            out += use_leaves(part, prefix)
        return out
    name = None
    if " as " in tree:
        tree, name = [x.strip() for x in tree.split(" as ")]
    segs = prefix + tuple(x.strip() for x in tree.split("::") if x.strip())
    if segs and segs[-1] == "self":
        segs = segs[:-1]
    if not segs:
        return []
    return [(segs, name or segs[-1])]


def test_modules(files):
    """The modules declared for tests only, and every module below them.
    A declaration with `#[path = "x.rs"]` names the file beside the
    declaring one (or inside its folder, for a `mod.rs`)."""
    roots = set()
    for m, p in files.items():
        text = re.sub(r"//[^\n]*", "", open(p, encoding="utf-8").read())
        for x in TEST_MOD_RE.finditer(text):
            path = re.search(r'#\[path\s*=\s*"([\w/]+)\.rs"\]', x.group(0))
            if path is None:
                roots.add(m + (x.group(1),))
                continue
            owner = m if os.path.basename(p) in ("mod.rs", "lib.rs", "main.rs") else m[:-1]
            roots.add(owner + tuple(path.group(1).split("/")))
    return {m for m in files if any(m[: len(r)] == r for r in roots)}


class Crate:
    def __init__(self, root, root_file=None):
        files = modules(root, root_file)
        # Test code is no layer: a test module may use any module of its
        # crate, and no module uses it.
        tests = test_modules(files)
        self.files = {m: p for m, p in files.items() if m not in tests}
        self.tests = tests
        self.text = {m: strip_code(open(p, encoding="utf-8").read()) for m, p in self.files.items()}
        self.items = {
            m: {x.group(1) for x in (ITEM_RE.match(l) for l in t.split("\n")) if x}
            for m, t in self.text.items()
        }
        self.uses = {}
        for m, t in self.text.items():
            leaves = {}
            for u in re.finditer(r"(?:^|\n)\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", t):
                for segs, name in use_leaves(u.group(1)):
                    leaves[name] = self.absolute(m, segs)
            self.uses[m] = leaves

    def absolute(self, m, segs):
        """segs written in module m as an absolute path, or None for an
        external crate or std."""
        segs = list(segs)
        if not segs:
            return None
        if segs[0] == "crate":
            base, segs = [], segs[1:]
        elif segs[0] in ("super", "self"):
            base = list(m)
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    base = base[:-1]
                segs = segs[1:]
        else:
            # A name the module imported, or a child module.
            if tuple(m) + (segs[0],) in self.files:
                base = list(m)
            else:
                return None
        return tuple(base + segs)

    def resolve(self, path, seen=None):
        """The module that defines what `path` (absolute) names."""
        seen = seen or set()
        if path is None or path in seen:
            return None
        seen.add(path)
        for k in range(len(path), -1, -1):
            mod = path[:k]
            if mod in self.tests:
                # Test code that only test code reaches: no edge.
                return None
            if mod in self.files:
                rest = path[k:]
                if not rest:
                    return mod
                name = rest[0]
                if name in self.items.get(mod, ()):
                    return mod
                if name in self.uses.get(mod, {}) and self.uses[mod][name] is None:
                    # A re-export of another crate's item: no edge here.
                    return None
                target = self.uses.get(mod, {}).get(name)
                if target is not None:
                    found = self.resolve(target + tuple(rest[1:]), seen)
                    return mod if found is None else found
                return mod
        return None

    def edges(self):
        out = {m: set() for m in self.files}
        for m, t in self.text.items():
            paths = [self.absolute(m, p.split("::")) for p in PATH_RE.findall(t)]
            paths += list(self.uses[m].values())
            for p in NAME_PATH_RE.findall(t):
                segs = p.split("::")
                if segs[0] in ("crate", "super", "self"):
                    continue
                if m + (segs[0],) in self.files:
                    paths.append(m + tuple(segs))
                elif segs[0] in self.uses[m] and self.uses[m][segs[0]] is not None:
                    paths.append(self.uses[m][segs[0]] + tuple(segs[1:]))
            for p in paths:
                # A path that names a module below this one (a room's
                # module re-exported at its parent's path) is structure, as
                # `mod` is.
                if p in self.files and len(p) > len(m) and p[: len(m)] == m:
                    continue
                d = self.resolve(p)
                if d is not None and d != m:
                    out[m].add(d)
        return out


def cycles(edges):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return comps


def folder_cycles(files, edges):
    """Circles between the children of one module, where at least one is a
    folder (a module with modules of its own): child X reaches child Y when
    a module inside X imports one inside Y. A file-level DAG can hide such
    a circle (`a::x -> b::y`, `b::z -> a::w`); a module folder that needs
    its sibling while the sibling needs it is no layer."""
    folders = {m[:k] for m in files for k in range(1, len(m))}
    out = []
    for parent in sorted({m[:-1] for m in files if m}):
        kids = {m[: len(parent) + 1] for m in files if len(m) > len(parent) and m[: len(parent)] == parent}
        if not kids & folders:
            continue
        up = {k: set() for k in kids}
        for a, ds in edges.items():
            ka = a[: len(parent) + 1]
            if ka not in kids or len(a) <= len(parent):
                continue
            for d in ds:
                kd = d[: len(parent) + 1]
                if kd in kids and kd != ka and len(d) > len(parent):
                    up[ka].add(kd)
        for comp in cycles(up):
            if any(k in folders for k in comp):
                out.append((comp, up))
    return out


def check(root, only=None, files_only=False, root_file=None):
    where = root_file or root
    c = Crate(root, root_file)
    e = c.edges()
    comps = cycles(e)
    folder = [] if files_only else folder_cycles(c.files, e)
    if only:
        # Only the cycles that touch a module under one of the prefixes.
        comps = [k for k in comps if any(m[: len(p)] == p for m in k for p in only)]
    name = lambda m: "::".join(("crate",) + m)
    if only:
        folder = [(k, up) for k, up in folder if any(m[: len(p)] == p for m in k for p in only)]
    for comp in comps:
        print(f"import cycle in {where}: " + ", ".join(name(m) for m in comp))
        for m in comp:
            inner = sorted(name(d) for d in e[m] if d in comp)
            print(f"  {name(m)} -> {', '.join(inner)}")
    for comp, up in folder:
        print(f"folder import cycle in {where}: " + ", ".join(name(m) for m in comp))
        for m in comp:
            inner = sorted(name(d) for d in up[m] if d in comp)
            print(f"  {name(m)} -> {', '.join(inner)}")
    n_edges = sum(len(v) for v in e.values())
    print(
        f"{where}: {len(e)} modules, {n_edges} import edges, {len(comps)} cycle(s), "
        f"{len(folder)} folder cycle(s)"
    )
    return 1 if comps or folder else 0


# Crates with known cycles, by crate root, each with the cycles left out
# of its check ("folder": its folder-level circles; "all": every cycle,
# still printed) and why. `--workspace` fails on every other cycle, and on
# a known crate that no longer has such a cycle (so the list shrinks).
KNOWN = {}


def workspace_targets():
    """(crate root file, source folder, root file to start from or None)
    for the library and binary of every workspace member, from `cargo
    metadata`. Where one folder holds two roots (`lib.rs` and `main.rs`),
    each crate is its root's `mod` tree."""
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    members = set(meta["workspace_members"])
    out = []
    for pkg in sorted(meta["packages"], key=lambda p: p["name"]):
        if pkg["id"] not in members:
            continue
        roots = [
            os.path.relpath(t["src_path"])
            for t in pkg["targets"]
            if set(t["kind"]) & {"lib", "rlib", "bin", "proc-macro"}
        ]
        for r in sorted(roots):
            d = os.path.dirname(r)
            shared = sum(1 for x in roots if os.path.dirname(x) == d) > 1
            out.append((r, d, r if shared else None))
    return out


def known_fails(kind, module_rc, left):
    """Whether a crate KNOWN with `kind` fails: a module cycle where only
    its folder-level cycles are known, or none of its known cycles `left`
    (a stale entry)."""
    if kind == "folder" and module_rc:
        return True
    return not left


def workspace():
    """Checks every crate of the workspace; 1 when a cycle was found that
    KNOWN does not list, or a KNOWN entry has none left."""
    bad, seen = [], set()
    for where, d, root_file in workspace_targets():
        kind, why = KNOWN.get(where, (None, None))
        seen.add(where)
        rc = check(d, files_only=kind == "folder", root_file=root_file)
        if kind is None:
            if rc:
                bad.append(where)
            continue
        c = Crate(d, root_file)
        e = c.edges()
        left = folder_cycles(c.files, e) if kind == "folder" else rc
        if known_fails(kind, rc, left):
            if kind == "folder" and rc:
                print(f"  {where}: a module cycle besides its known folder-level cycles")
            else:
                print(f"  {where} has no such cycle left: remove it from KNOWN")
            bad.append(where)
        else:
            what = "folder-level cycles" if kind == "folder" else "cycles"
            print(f"  known, not failing: its {what} ({why})")
    for where in sorted(set(KNOWN) - seen):
        print(f"{where} is in KNOWN but no workspace crate")
        bad.append(where)
    if bad:
        print("import cycles (or a stale KNOWN entry) in: " + ", ".join(bad))
        return 1
    n = len(set(KNOWN) & seen)
    print(f"{len(seen)} crates: no import cycle but in the {n} known ones listed above")
    return 0


def write_tree(d, files):
    """Writes each of `files` (a path under `d`: its text), folders made as needed."""
    for f, t in files.items():
        os.makedirs(os.path.dirname(os.path.join(d, f)), exist_ok=True)
        open(os.path.join(d, f), "w").write(t)


def selftest():
    with tempfile.TemporaryDirectory() as d:
        write_tree(d, {
            "lib.rs": "pub mod a;\npub mod b;\n",
            "a/mod.rs": "mod inner;\npub use inner::Thing;\npub fn helper() {}\n",
            "a/inner.rs": "pub struct Thing;\n",
            "b.rs": "use crate::a::Thing;\npub fn f(_: Thing) {}\n",
        })
        assert check(d) == 0, "a DAG (with a re-export) was reported as a cycle"
        # A test module (`cfg(test)` or `cfg(all(test, ...))`) is no dependency.
        write_tree(d, {"a/inner.rs":
            "pub struct Thing;\n#[cfg(all(test, feature = \"std\"))]\n"
            "mod tests {\n    use super::super::helper;\n}\n"})
        assert check(d) == 0, "a test module's import was reported as a cycle"
        # The child now uses its parent's helper while the parent uses it.
        write_tree(d, {"a/inner.rs":
            "pub struct Thing;\npub fn g() { super::helper() }\n"})
        assert check(d) == 1, "a parent/child cycle was not found"
        write_tree(d, {"a/inner.rs": "pub struct Thing;\n"})
        write_tree(d, {"b.rs":
            "pub fn f() { crate::a::helper() }\npub fn h() {}\n"})
        write_tree(d, {"a/mod.rs":
            "mod inner;\npub use inner::Thing;\npub fn helper() { crate::b::h() }\n"})
        assert check(d) == 1, "a cycle between sibling modules was not found"
    with tempfile.TemporaryDirectory() as d:
        # Two folders, each with two files: x's first file uses y's first,
        # y's second uses x's second. No file-level cycle; a folder one.
        write_tree(d, {
            "lib.rs": "pub mod x;\npub mod y;\n",
            "x/mod.rs": "pub mod one;\npub mod two;\n",
            "y/mod.rs": "pub mod one;\npub mod two;\n",
            "x/one.rs": "pub fn f() { crate::y::one::g() }\n",
            "x/two.rs": "pub fn h() {}\n",
            "y/one.rs": "pub fn g() {}\n",
            "y/two.rs": "pub fn k() {}\n",
        })
        assert check(d) == 0, "one folder using its sibling was reported as a cycle"
        # A test-only module file (`#[cfg(test)] mod tests;`) is test code:
        # its use of the sibling folder is no edge back.
        write_tree(d, {
            "y/mod.rs": "pub mod one;\npub mod two;\n#[cfg(test)]\nmod tests;\n",
            "y/tests.rs": "use crate::x::two::h;\n",
        })
        assert check(d) == 0, "a test module's import was reported as a folder cycle"
        # The same through a test module whose file is named by #[path].
        write_tree(d, {
            "y/mod.rs": "pub mod one;\npub mod two;\n",
            "y/two.rs": "pub fn k() {}\n#[cfg(test)]\n#[path = \"two_tests.rs\"]\nmod tests;\n",
            "y/two_tests.rs": "use crate::x::two::h;\n",
        })
        os.remove(os.path.join(d, "y/tests.rs"))
        assert check(d) == 0, "a #[path] test module's import was reported as a folder cycle"
        write_tree(d, {"y/two.rs": "pub fn k() { crate::x::two::h() }\n"})
        assert check(d) == 1, "a cycle between sibling folders was not found"
    with tempfile.TemporaryDirectory() as d:
        # A library and a binary in one folder: each is its root's tree.
        lib, main = os.path.join(d, "lib.rs"), os.path.join(d, "main.rs")
        write_tree(d, {
            "lib.rs": "pub mod a;\n",
            "a.rs": "pub fn f() {}\n",
            "main.rs": "mod b;\npub fn g() {}\nfn main() { b::h() }\n",
            "b.rs": "pub fn h() { crate::g() }\n",
        })
        assert check(d, root_file=lib) == 0, "the library was given the binary's modules"
        assert check(d, root_file=main) == 1, "a cycle in the binary's tree was not found"
    assert known_fails("folder", 1, ["x <-> y"]), "a module cycle hid behind a known folder cycle"
    assert not known_fails("folder", 0, ["x <-> y"]), "a known folder cycle failed"
    assert known_fails("folder", 0, []), "a stale KNOWN entry passed"
    print(
        "selftest: a DAG passes, test modules are no edges; a module cycle in "
        "a crate known for its folder cycles fails; a parent/child "
        "cycle, a sibling cycle, a sibling-folder cycle and a cycle in a "
        "binary beside its library fail"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--selftest":
        sys.exit(selftest())
    if len(sys.argv) > 1 and sys.argv[1] == "--workspace":
        sys.exit(workspace())
    args = sys.argv[1:]
    only = None
    files_only = "--files-only" in args
    if files_only:
        args.remove("--files-only")
    if "--only" in args:
        i = args.index("--only")
        only = [tuple(p.split("::")) for p in args[i + 1].split(",")]
        del args[i : i + 2]
    sys.exit(check(args[0] if args else "crates/s2mmu-migrate/src", only, files_only))
