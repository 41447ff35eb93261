#!/usr/bin/env python3
"""Lists a crate's public API from rustdoc's JSON output, one item a line,
sorted, so that `api/<crate>.txt` changes exactly where the API does.

    cargo +nightly rustdoc -p CRATE --lib [--all-features] -- \
        -Z unstable-options --output-format json
    python3 .ci/public_api.py target/doc/CRATE.json > api/CRATE.txt

Every public path an item is reachable by is listed (a re-export gives a
second line), with its signature: functions and methods with their
parameter and return types, structs with their public fields, enums with
their variants, traits with their items, trait implementations (auto
traits included, blanket ones left out: they follow from the others).
Written for rustdoc JSON format versions 40 and later (57 here); an
unknown type form prints as `?kind` rather than failing, so a newer
nightly shows up as a diff to look at, not as a crash.
"""
import json
import sys


def main(path):
    d = json.load(open(path))
    idx = d["index"]
    lines = set()
    crate = idx[str(d["root"])]["name"]
    walk_module(idx, idx[str(d["root"])], crate, lines, set())
    for line in sorted(lines):
        print(line)


def item(idx, i):
    return idx.get(str(i))


def walk_module(idx, m, path, out, seen):
    if (m["id"], path) in seen:
        return
    seen.add((m["id"], path))
    out.add(f"pub mod {path}")
    for i in m["inner"]["module"]["items"]:
        it = item(idx, i)
        if it is None:
            continue
        kind = next(iter(it["inner"]))
        if kind == "use":
            u = it["inner"]["use"]
            target = item(idx, u["id"]) if u["id"] is not None else None
            if u["is_glob"]:
                if target is not None and "module" in target["inner"]:
                    for j in target["inner"]["module"]["items"]:
                        t = item(idx, j)
                        if t is not None and t.get("name") and t["visibility"] == "public":
                            emit(idx, t, f"{path}::{t['name']}", out, seen)
                else:
                    out.add(f"pub use {path}::{u['source']}::*")
            elif target is None:
                out.add(f"pub use {path}::{u['name']} = {u['source']}")
            else:
                emit(idx, target, f"{path}::{u['name']}", out, seen)
        elif it["visibility"] == "public" and it.get("name"):
            emit(idx, it, f"{path}::{it['name']}", out, seen)


def emit(idx, it, path, out, seen):
    kind, inner = next(iter(it["inner"].items()))
    if kind == "module":
        walk_module(idx, it, path, out, seen)
    elif kind == "function":
        out.add(fn_line(inner, path))
    elif kind == "struct":
        g = generics(inner["generics"])
        k = inner["kind"]
        if isinstance(k, dict) and "plain" in k:
            for f in k["plain"]["fields"]:
                fi = item(idx, f)
                if fi is not None and fi["visibility"] == "public":
                    out.add(f"pub {path}::{fi['name']}: {ty(fi['inner']['struct_field'])}")
            out.add(f"pub struct {path}{g}")
        elif isinstance(k, dict) and "tuple" in k:
            fields = [ty(item(idx, f)["inner"]["struct_field"]) if f is not None and item(idx, f)["visibility"] == "public" else "_" for f in k["tuple"]]
            out.add(f"pub struct {path}{g}({', '.join(fields)})")
        else:
            out.add(f"pub struct {path}{g}")
        impls(idx, inner["impls"], path, out)
    elif kind == "enum":
        out.add(f"pub enum {path}{generics(inner['generics'])}")
        for v in inner["variants"]:
            vi = item(idx, v)
            out.add(f"pub {path}::{vi['name']}{variant(idx, vi['inner']['variant'])}")
        impls(idx, inner["impls"], path, out)
    elif kind == "union":
        out.add(f"pub union {path}{generics(inner['generics'])}")
        impls(idx, inner["impls"], path, out)
    elif kind == "trait":
        unsafe = "unsafe " if inner["is_unsafe"] else ""
        bounds = ": " + " + ".join(bound(b) for b in inner["bounds"]) if inner["bounds"] else ""
        out.add(f"pub {unsafe}trait {path}{generics(inner['generics'])}{bounds}")
        for i in inner["items"]:
            ti = item(idx, i)
            tk, tin = next(iter(ti["inner"].items()))
            p = f"{path}::{ti['name']}"
            if tk == "function":
                out.add(fn_line(tin, p, provided=tin["has_body"]))
            elif tk == "assoc_type":
                b = " + ".join(bound(x) for x in tin["bounds"])
                out.add(f"type {p}{generics(tin['generics'])}{': ' + b if b else ''}")
            elif tk == "assoc_const":
                out.add(f"const {p}: {ty(tin['type'])}")
    elif kind == "constant":
        out.add(f"pub const {path}: {ty(inner['type'])}")
    elif kind == "static":
        mut = "mut " if inner["is_mutable"] else ""
        out.add(f"pub static {mut}{path}: {ty(inner['type'])}")
    elif kind == "type_alias":
        out.add(f"pub type {path}{generics(inner['generics'])} = {ty(inner['type'])}")
    elif kind in ("macro", "proc_macro"):
        out.add(f"pub macro {path}!")
    else:
        out.add(f"pub {kind} {path}")


def impls(idx, ids, path, out):
    for i in ids:
        im = item(idx, i)
        if im is None:
            continue
        inner = im["inner"]["impl"]
        if inner["blanket_impl"] is not None:
            continue
        head = f"impl{generics(inner['generics'])} "
        neg = "!" if inner["is_negative"] else ""
        if inner["trait"] is not None:
            unsafe = "unsafe " if inner["is_unsafe"] else ""
            # An auto trait's impl that rustdoc inferred (Send, Sync, ...)
            # is listed without its bounds: nightlies spell the bounds they
            # infer differently (2026-10-29's writes `&'a F: Send` where
            # earlier ones wrote `F: Send`), so the bounds would make the
            # listing follow the toolchain instead of the API. Whether the
            # impl exists is still listed, and the fields and generics the
            # bounds follow from are listed with their types.
            bounds = "" if inner.get("is_synthetic") else where(inner["generics"])
            out.add(f"{unsafe}{head}{neg}{path_ty(inner['trait'])} for {ty(inner['for'])}{bounds}")
            continue
        for j in inner["items"]:
            mi = item(idx, j)
            if mi is None or mi["visibility"] != "public":
                continue
            mk, min_ = next(iter(mi["inner"].items()))
            p = f"{path}::{mi['name']}"
            if mk == "function":
                out.add(fn_line(min_, p, on=(generics(inner["generics"]), ty(inner["for"]))))
            elif mk == "assoc_const":
                out.add(f"pub const {p}: {ty(min_['type'])}")


def fn_line(f, path, provided=None, on=None):
    h = f["header"]
    q = ("const " if h["is_const"] else "") + ("async " if h["is_async"] else "") + ("unsafe " if h["is_unsafe"] else "")
    abi = h["abi"]
    if abi != "Rust":
        q += f"extern {abi if isinstance(abi, str) else next(iter(abi))} "
    ins = ", ".join(arg(n, t) for n, t in f["sig"]["inputs"])
    out = f["sig"]["output"]
    ret = f" -> {ty(out)}" if out is not None else ""
    tail = " (provided)" if provided else ""
    # A method of a generic type: which impl block it is in.
    onpart = f" [in impl{on[0]} {on[1]}]" if on and on[0] else ""
    return f"pub {q}fn {path}{generics(f['generics'])}({ins}){ret}{where(f['generics'])}{onpart}{tail}"


def arg(name, t):
    if name == "self":
        if t == {"generic": "Self"}:
            return "self"
        if "borrowed_ref" in t and t["borrowed_ref"]["type"] == {"generic": "Self"}:
            r = t["borrowed_ref"]
            lt = r["lifetime"] + " " if r["lifetime"] else ""
            return f"&{lt}{'mut ' if r['is_mutable'] else ''}self"
    return f"{name}: {ty(t)}"


def variant(idx, v):
    k = v["kind"]
    if k == "plain":
        d = v.get("discriminant")
        return f" = {d['expr']}" if d else ""
    if "tuple" in k:
        return "(" + ", ".join(ty(item(idx, f)["inner"]["struct_field"]) if f is not None else "_" for f in k["tuple"]) + ")"
    if "struct" in k:
        fs = [item(idx, f) for f in k["struct"]["fields"]]
        return " { " + ", ".join(f"{f['name']}: {ty(f['inner']['struct_field'])}" for f in fs) + " }"
    return ""


def generics(g):
    ps = []
    for p in g["params"]:
        k, v = next(iter(p["kind"].items()))
        if k == "lifetime":
            ps.append(p["name"] + (": " + " + ".join(v["outlives"]) if v["outlives"] else ""))
        elif k == "type":
            if v.get("is_synthetic"):
                continue
            b = " + ".join(bound(x) for x in v["bounds"])
            d = f" = {ty(v['default'])}" if v.get("default") else ""
            ps.append(p["name"] + (": " + b if b else "") + d)
        elif k == "const":
            ps.append(f"const {p['name']}: {ty(v['type'])}")
    return "<" + ", ".join(ps) + ">" if ps else ""


def where(g):
    preds = []
    for w in g["where_predicates"]:
        k, v = next(iter(w.items()))
        if k == "bound_predicate":
            preds.append(f"{ty(v['type'])}: " + " + ".join(bound(b) for b in v["bounds"]))
        elif k == "lifetime_predicate":
            preds.append(f"{v['lifetime']}: " + " + ".join(v["outlives"]))
        elif k == "eq_predicate":
            preds.append(f"{ty(v['lhs'])} = {term(v['rhs'])}")
    return " where " + ", ".join(preds) if preds else ""


def bound(b):
    k, v = next(iter(b.items())) if isinstance(b, dict) else (b, None)
    if k == "trait_bound":
        m = {"none": "", "maybe": "?", "maybe_const": "~const "}.get(v.get("modifier", "none"), "")
        hr = ""
        if v.get("generic_params"):
            hr = "for<" + ", ".join(p["name"] for p in v["generic_params"]) + "> "
        return f"{hr}{m}{path_ty(v['trait'])}"
    if k == "outlives":
        return v
    if k == "use":
        return "use<..>"
    return f"?{k}"


def term(t):
    if "type" in t:
        return ty(t["type"])
    return t.get("constant", {}).get("expr", "?")


def path_ty(p):
    # The path as the source spelled it (`super::Mmu`, `crate::Result`):
    # its last segment, so that how an import is written makes no diff.
    return p["path"].split("::")[-1] + args(p.get("args"))


def args(a):
    if not a:
        return ""
    if "angle_bracketed" in a:
        ab = a["angle_bracketed"]
        xs = []
        for x in ab["args"]:
            if x == "infer":
                xs.append("_")
                continue
            k, v = next(iter(x.items()))
            xs.append(v if k == "lifetime" else ty(v) if k == "type" else v.get("expr", "?") if k == "const" else "_")
        for c in ab["constraints"]:
            b = c["binding"]
            if "equality" in b:
                xs.append(f"{c['name']}{args(c.get('args'))} = {term(b['equality'])}")
            else:
                xs.append(f"{c['name']}: " + " + ".join(bound(x) for x in b["constraint"]))
        return "<" + ", ".join(xs) + ">" if xs else ""
    if "parenthesized" in a:
        p = a["parenthesized"]
        out = f" -> {ty(p['output'])}" if p.get("output") else ""
        return "(" + ", ".join(ty(x) for x in p["inputs"]) + ")" + out
    return ""


def ty(t):
    if t is None:
        return "()"
    k, v = next(iter(t.items()))
    if k in ("primitive", "generic"):
        return v
    if k == "resolved_path":
        return path_ty(v)
    if k == "borrowed_ref":
        lt = v["lifetime"] + " " if v["lifetime"] else ""
        return f"&{lt}{'mut ' if v['is_mutable'] else ''}{ty(v['type'])}"
    if k == "raw_pointer":
        return f"*{'mut' if v['is_mutable'] else 'const'} {ty(v['type'])}"
    if k == "slice":
        return f"[{ty(v)}]"
    if k == "array":
        return f"[{ty(v['type'])}; {v['len']}]"
    if k == "tuple":
        return "(" + ", ".join(ty(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if k == "impl_trait":
        return "impl " + " + ".join(bound(b) for b in v)
    if k == "dyn_trait":
        parts = [bound({"trait_bound": x}) for x in v["traits"]]
        if v.get("lifetime"):
            parts.append(v["lifetime"])
        return "dyn " + " + ".join(parts)
    if k == "qualified_path":
        tr = f" as {path_ty(v['trait'])}" if v.get("trait") else ""
        return f"<{ty(v['self_type'])}{tr}>::{v['name']}{args(v.get('args'))}"
    if k == "function_pointer":
        s = v["sig"]
        ret = f" -> {ty(s['output'])}" if s["output"] is not None else ""
        return "fn(" + ", ".join(ty(x) for _, x in s["inputs"]) + ")" + ret
    if k == "infer":
        return "_"
    if k == "pat":
        return ty(v["type"])
    return f"?{k}"


if __name__ == "__main__":
    main(sys.argv[1])
