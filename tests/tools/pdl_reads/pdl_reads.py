#!/usr/bin/env python3
"""Which kernel parameters a kernel reads through the non-coherent read-only path after its PDL wait.

Under programmatic dependent launch a kernel runs while the one before it still writes; after
griddepcontrol.wait it may read that kernel's output only with ordinary loads (ld_dep, kernels/launch.cuh),
never with ld.global.nc (__ldg, or a plain load from a const __restrict__ pointer), which is defined only for
data nobody writes while the kernel runs. This lists, for every kernel entry of the given PTX files (or .cu
files, compiled to PTX with nvcc), the parameters behind each ld.global.nc after the first
griddepcontrol.wait, found by following the address registers back to their ld.param (all definitions of
a register are followed; PTX is not SSA, so the answer may name a parameter too many, never one too few).
Every parameter listed must be data no kernel of the step writes: weights, scales, biases, block tables,
the step's uploaded inputs.

  python3 tests/tools/pdl_reads/pdl_reads.py kernels/*.cu            # nvcc -ptx -arch=sm_90a, -I. -Ibuild/generated
  python3 tests/tools/pdl_reads/pdl_reads.py --only gemv kernels/gemv.cu
  python3 tests/tools/pdl_reads/pdl_reads.py /tmp/ptx/*.ptx
  python3 tests/tools/pdl_reads/pdl_reads.py --check tests/tools/pdl_reads/allowed.txt kernels/*.cu

--check FILE: exit 1, naming each, where a kernel reads a parameter (or module variable) that FILE does
not list for it; FILE has a line "kernel #index why..." (or "kernel variable why...") for each.
tests/cli/test_pdl_reads.sh runs it over kernels/ in CI.
"""
import concurrent.futures
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ENTRY = re.compile(r"\.entry\s+(\S+)\s*\((.*?)\)\s*(?:\.\w+[^{]*)?\{(.*?)\n\}", re.S)
INSN = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.:]*)\s+([^;]*);", re.M)
REG = re.compile(r"%[a-z]+\d+")
SCALARS = {"int", "unsigned int", "long", "unsigned long", "long long", "unsigned long long", "float", "double",
           "bool", "char", "unsigned char", "short", "unsigned short"}


def param_names(decl):
    """The parameter names of an entry's declaration (.param .u64 .ptr .global .align 1 name, or
    .param .align 8 .b8 name[40]): each one's last word, without its size."""
    return [re.sub(r"\[\d+\]$", "", p.split()[-1]) for p in decl.split(",") if p.strip()]


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return dict(zip(names, out))


def arg_types(demangled):
    """The argument types of a demangled signature, split at its top-level commas."""
    end = demangled.rfind(")")
    depth, start = 0, None
    for i in range(end, -1, -1):
        c = demangled[i]
        depth += c in ")>"
        depth -= c in "(<"
        if depth == 0 and c == "(":
            start = i
            break
    if start is None:
        return []
    out, depth, cur = [], 0, ""
    for c in demangled[start + 1:end]:
        depth += c in "(<"
        depth -= c in ")>"
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    return out + ([cur.strip()] if cur.strip() else [])


def module_globals(text):
    """The module's global and constant variables (e.g. the math library's tables)."""
    decl = r"^\s*(?:\.visible\s+|\.extern\s+)?\.(?:global|const)\s+[^;]*?([\w$]+)(?:\[\d*\])?\s*(?:=[^;]*)?;"
    return set(re.findall(decl, text, re.M))


def nc_params(params, body, symbols=frozenset()):
    """What is behind each ld.global.nc after the wait: {load type: set(parameter indices, or module
    variable names)}."""
    index = {p: i for i, p in enumerate(params)}
    index.update({g: g for g in symbols})
    defs = {}  # register -> [source registers, parameters or variables named], over all its definitions
    insns = []
    for m in INSN.finditer(body):
        op, args = m.group(1), m.group(2).strip()
        insns.append((m.start(), op, args))
        if args.startswith("{"):  # a vector destination: {%r1, %r2}, sources
            group, _, rest = args[1:].partition("}")
            dsts, rest = REG.findall(group), rest.lstrip(", ")
        else:
            first, _, rest = args.partition(",")
            dsts = [first.strip()] if REG.fullmatch(first.strip()) else []
        srcs = set(REG.findall(rest))
        pars = {w for w in re.findall(r"[\w$]+", rest) if w in index}
        for dst in dsts:
            d = defs.setdefault(dst, [set(), set()])
            d[0] |= srcs
            d[1] |= pars
    wait = body.find("griddepcontrol.wait")
    if wait < 0:
        return None

    def origins(reg):
        found, seen, todo = set(), {reg}, [reg]
        while todo:
            r = todo.pop()
            srcs, pars = defs.get(r, (set(), set()))
            found |= {index[p] for p in pars}
            todo += [x for x in srcs if x not in seen]
            seen |= srcs
        return found

    result = {}
    for pos, op, args in insns:
        if pos < wait or not op.startswith("ld.global.nc"):
            continue
        am = re.search(r"\[([^\]]+)\]", args)
        regs = REG.findall(am.group(1)) if am else []
        got = set()
        for r in regs:
            got |= origins(r)
        result.setdefault(op, set()).update(got)
    return result


def ptx_of(path, args, tmp):
    if path.endswith(".ptx"):
        return path
    out = os.path.join(tmp, os.path.basename(path) + ".ptx")
    cmd = [args.nvcc, "-ptx", "-arch=" + args.arch, "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
           "-DLLMQ_HAVE_CUDA=1", "-DLLMQ_HAVE_CUDA_BACKEND=1", "-DLLMQ_HAVE_SM90A", "-D_GNU_SOURCE"]
    cmd += ["-I" + i for i in args.include] + [path, "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{path}: nvcc failed:\n{r.stderr}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help=".cu (compiled with nvcc -ptx) or .ptx files")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("-I", dest="include", action="append", default=None,
                    help="include folder for .cu files (default: . and build/generated)")
    ap.add_argument("--only", default="", help="kernels whose mangled name contains this")
    ap.add_argument("--check", metavar="FILE", help="what each kernel may read that way (see above)")
    args = ap.parse_args()
    if args.include is None:
        args.include = [".", "build/generated"]
    allowed = read_allowed(args.check) if args.check else None
    n_kernels, refused = 0, []
    with tempfile.TemporaryDirectory() as tmp:
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            ptx = list(pool.map(lambda f: ptx_of(f, args, tmp), args.files))
        for f, pf in zip(args.files, ptx):
            text = open(pf).read()
            entries = [(m.group(1), param_names(m.group(2)), m.group(3)) for m in ENTRY.finditer(text)]
            symbols = module_globals(text)
            names = demangle([e[0] for e in entries])
            seen = set()
            for name, params, body in entries:
                if args.only not in name:
                    continue
                r = nc_params(params, body, symbols)
                if not r:
                    continue
                types = arg_types(names[name])

                def arg(i):  # pointers and structs: the data read (an int or float is index arithmetic)
                    if isinstance(i, str):
                        return f"module variable {i}"
                    t = types[i] if i < len(types) else "?"
                    return None if t in SCALARS else f"#{i} {t}"

                line = "; ".join(
                    f"{op} <- " + (", ".join(a for a in map(arg, sorted(ix, key=str)) if a) or "(no parameter found)")
                    for op, ix in sorted(r.items()))
                full = names[name].replace("(anonymous namespace)::", "")
                kernel = re.split(r"[<(]", re.sub(r"^void ", "", full))[0]
                if (kernel, line) in seen:  # one line per kernel and finding, not per instantiation
                    continue
                seen.add((kernel, line))
                n_kernels += 1
                print(f"{os.path.basename(f)}: {kernel}\n    {line}")
                if allowed is not None:
                    for ix in set().union(*r.values()):
                        a = arg(ix)
                        key = f"#{ix}" if isinstance(ix, int) else ix
                        if a and key not in allowed.get(kernel, ()) and (kernel, key) not in refused:
                            refused.append((kernel, key))
                            print(f"NOT ALLOWED {f}: {kernel} reads {a} through ld.global.nc after "
                                  "griddepcontrol.wait: if an earlier kernel of the step writes it, read "
                                  f"it with ld_dep (kernels/launch.cuh); if none does, add it to {args.check}")
    print(f"{n_kernels} kernel(s) read through ld.global.nc after griddepcontrol.wait", file=sys.stderr)
    if refused:
        sys.exit(1)


def read_allowed(path):
    """{kernel: {"#index" or variable name}} from path's lines "kernel key why..." (# begins a comment line)."""
    allowed = {}
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            words = raw.split()
            if not words or words[0].startswith("#"):
                continue
            if len(words) < 3:
                sys.exit(f"{path}:{n}: want \"kernel #index why\" or \"kernel variable why\", got: {raw.strip()}")
            allowed.setdefault(words[0], set()).add(words[1])
    return allowed


if __name__ == "__main__":
    main()
