#!/usr/bin/env python3
"""The workspace's shape, as issue 45 asks it to stay: no circle in the import map (every
`crate::`/`super::` path between files of a crate, tests aside) and no non-test function
over 120 lines. Prints what breaks either and exits 1; `tests/it/shape.rs` runs it.

Reads Rust as text: comments, strings and raw strings are blanked first, a function is its
`fn` to the brace that closes its body, and a `#[cfg(test)] mod` (to the end of its file)
is left out, as are `tests.rs`, `in_process.rs`, conformance suites and `testing/`.
Standard library only."""

import os
import re
import sys

ROOTS = {"engine": "engine/src", "executors": "executors/src", "steps": "steps/src",
         "server": "server/src", "bin": "src", "bench": "bench/src"}
LONGEST = 120
TEST_FILES = ("tests.rs", "in_process.rs")


def strip(src):
    out=[];i=0;n=len(src)
    while i<n:
        c=src[i]
        if src.startswith('//',i):
            j=src.find('\n',i); j=n if j<0 else j; out.append(' '*(j-i)); i=j; continue
        if src.startswith('/*',i):
            j=src.find('*/',i)+2; out.append(re.sub(r'[^\n]',' ',src[i:j])); i=j; continue
        m=re.match(r'r(#*)"',src[i:i+10]) if c=='r' and (i==0 or not (src[i-1].isalnum() or src[i-1]=='_')) else None
        if m:
            end='"'+m.group(1); j=src.find(end,i+len(m.group(0)))+len(end); out.append(re.sub(r'[^\n]',' ',src[i:j])); i=j; continue
        if c=='"':
            j=i+1
            while src[j]!='"':
                j+= 2 if src[j]=='\\' else 1
            j+=1; out.append(re.sub(r'[^\n]',' ',src[i:j])); i=j; continue
        if c=="'":
            m=re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x..'",src[i:i+12])
            if m: out.append(' '*len(m.group(0))); i+=len(m.group(0)); continue
        out.append(c); i+=1
    return ''.join(out)


def sources(root):
    """The non-test source files under `root` and their text, blanked, test modules cut."""
    for dp, _, files in os.walk(root):
        for f in sorted(files):
            p = os.path.join(dp, f)
            if not f.endswith(".rs") or f in TEST_FILES or "conformance" in p or "/testing" in p:
                continue
            s = strip(open(p, encoding="utf-8").read())
            m = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", s)
            yield p, (s[: m.start()] if m else s)


def long_functions(root):
    for p, s in sources(root):
        for m in re.finditer(r"\bfn\s+(\w+)[^;{]*\{", s):
            depth, j = 0, m.end() - 1
            while True:
                if s[j] == "{":
                    depth += 1
                elif s[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            first, last = s.count("\n", 0, m.start()) + 1, s.count("\n", 0, j) + 1
            if last - first + 1 > LONGEST:
                yield f"{p}:{first}: fn {m.group(1)} is {last - first + 1} lines"


def module_of(root, p):
    parts = os.path.relpath(p, root)[:-3].split("/")
    return parts[:-1] if parts[-1] in ("mod", "lib", "main") else parts


def file_of(root, segs):
    """The file a module path names: its longest prefix that is a file."""
    for k in range(len(segs), -1, -1):
        base = os.path.join(root, *segs[:k])
        cands = [base + ".rs", os.path.join(base, "mod.rs")] if k else \
            [os.path.join(root, "lib.rs"), os.path.join(root, "main.rs")]
        for c in cands:
            if os.path.isfile(c):
                return c
    return None


def import_map(root):
    edges = {}
    for p, s in sources(root):
        if "/bin/" in p:
            continue
        me = module_of(root, p)
        paths = [m.group(1, 2) for m in re.finditer(r"\b(crate|super)((?:::\w+)+)", s)]
        for m in re.finditer(r"use\s+(crate|super)::\{([^;]*)\};", s):
            for part in m.group(2).split(","):
                names = [x.strip("{} ") for x in part.strip().split("::") if x.strip("{} ")]
                if names and names[0] != "self":
                    paths.append((m.group(1), "::" + "::".join(names)))
        for kind, rest in paths:
            segs = rest.split("::")[1:]
            target = segs if kind == "crate" else me[:-1] + segs
            while target and target[0] == "super":
                target = target[1:]
            t = file_of(root, target)
            if t and os.path.abspath(t) != os.path.abspath(p):
                edges.setdefault(p, set()).add(t)
    return edges


def circles(edges):
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    nodes = sorted(set(edges) | {t for ts in edges.values() for t in ts})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(edges.get(w, ())))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return found


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    problems = []
    for root in ROOTS.values():
        if not os.path.isdir(root):
            continue
        problems += list(long_functions(root))
        edges = import_map(root)
        for comp in circles(edges):
            inside = [f"{a} -> {b}" for a in comp for b in sorted(edges.get(a, ())) if b in comp]
            problems.append("a circle of imports: " + "; ".join(inside))
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s) in the workspace's shape")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
