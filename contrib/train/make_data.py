#!/usr/bin/env python3
"""Builds the (document, summary) pairs the tiny summarizer is trained on, from text Debian ships.

    contrib/train/make_data.py --out DIR [--seed 1] [--man] [--dumpavail FILE]

Sources (Python's standard library only):
  * package descriptions: every binary package in the archive index has a one-line short
    description (the summary) and a long description paragraph (the document). The long ones are
    in the index's English translation files, which apt fetches only when asked:
        apt-get -o Acquire::Languages=en update
    (the package's source name comes from `apt-cache dumpavail`);
  * with --man, the manual pages installed on this machine (/usr/share/man/man1 and man8): the
    NAME line's text after "\\-" (the summary) against the DESCRIPTION section (the document).
    Off by default: which pages are installed differs between machines, the index does not.

Pairs are cleaned (Debian's " ." blank lines, list bullets, roff escapes), deduplicated (the same
document text is kept once), and pairs whose document is shorter than 12 words or whose summary is
longer than 20 words are dropped. The split is by *source* package (a manual page counts under its
page name), hashed with the seed, so libfoo1 and libfoo-dev never land on both sides: about 90 % /
5 % / 5 % train / validation / test.

Writes DIR/{train,valid,test}.jsonl, one {"id", "source", "document", "summary"} per line, and
DIR/stats.json (counts per split and source). The same index and seed give the same files.
"""
import argparse
import glob
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys

MIN_DOC_WORDS = 12
MAX_SUMMARY_WORDS = 20
MAX_DOC_CHARS = 2000


def split_of(key, seed):
    """'train', 'valid' or 'test' from a stable hash of the grouping key and the seed."""
    h = int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:8], 16) % 100
    return "test" if h < 5 else "valid" if h < 10 else "train"


def clean_long_description(lines):
    """Debian's long description: lines after the first, one leading space; ' .' is a blank line."""
    out = []
    for line in lines:
        line = line[1:] if line.startswith(" ") else line
        if line.strip() == ".":
            out.append("")
            continue
        line = re.sub(r"^\s*[*o+-]\s+", "", line)  # list bullets
        out.append(line.strip())
    text = "\n".join(out)
    paras = [" ".join(p.split()) for p in text.split("\n\n")]
    return "\n\n".join(p for p in paras if p)


def stanzas(text, multiline):
    """Each deb822 stanza as {field: value}; the continuation lines of a field named in multiline
    are kept as a list of lines (first line first)."""
    for stanza in text.split("\n\n"):
        fields, cur = {}, None
        for line in stanza.split("\n"):
            if line.startswith((" ", "\t")):
                if cur in multiline:
                    fields[cur].append(line)
                continue
            key, _, value = line.partition(":")
            cur = key
            fields[key] = [value.strip()] if key in multiline else value.strip()
        if fields.get("Package"):
            yield fields


def package_pairs(dump, translations):
    """(group key, id, document, summary): the translation files' Description-en, grouped by the
    source package that `apt-cache dumpavail` names (the binary package's own name if none)."""
    source_of = {}
    for f in stanzas(dump, ()):
        source_of[f["Package"]] = f.get("Source", f["Package"]).split(" ")[0]
    for text in translations:
        for f in stanzas(text, ("Description-en",)):
            desc = f.get("Description-en")
            if not desc or len(desc) < 2:
                continue
            name = f["Package"]
            summary = " ".join(desc[0].split())
            yield source_of.get(name, name), "pkg:" + name, clean_long_description(desc[1:]), summary


def translation_texts():
    """The text of every English translation file apt has fetched (decompressed by apt itself)."""
    paths = sorted(glob.glob("/var/lib/apt/lists/*_i18n_Translation-en*"))
    paths = [p for p in paths if not p.endswith((".diff", "_Index"))]
    if not paths:
        sys.exit("make_data: no Translation-en files in /var/lib/apt/lists; run\n"
                 "  apt-get -o Acquire::Languages=en update")
    for p in paths:
        yield subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", p], check=True,
                             capture_output=True, text=True, errors="replace").stdout


ROFF_ESCAPES = [
    (r"\\f\[[^\]]*\]|\\f\(..|\\f.", ""),  # font changes
    (r"\\\(em|\\\(en", "-"),
    (r"\\\(aq", "'"),
    (r"\\\(dq|\\\(lq|\\\(rq", '"'),
    (r"\\\(..", ""),
    (r"\\\[[^\]]*\]", ""),
    (r"\\\*\(..|\\\*.", ""),
    (r"\\s[+-]?\d", ""),
    (r"\\&|\\\||\\\^|\\:|\\c|\\%", ""),
    (r"\\-", "-"),
    (r"\\e", "\\\\"),
    (r"\\ ", " "),
]


def unroff(line):
    for pattern, repl in ROFF_ESCAPES:
        line = re.sub(pattern, repl, line)
    return line.replace("\\", "")


def man_text(path):
    """The NAME summary and the DESCRIPTION text of one roff page, or None."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt", errors="replace") as f:
            src = f.read(200000)
    except (OSError, EOFError):
        return None
    if src.startswith(".so "):  # a link to another page
        return None
    section, name_lines, desc_lines = None, [], []
    for raw in src.split("\n"):
        if raw.startswith((".SH", ".Sh")):
            section = unroff(raw[3:]).strip().strip('"').upper()
            continue
        if raw.startswith(('.\\"', "'\\\"")):
            continue
        if raw.startswith("."):
            macro, _, rest = raw.partition(" ")
            if macro in (".B", ".I", ".BR", ".IR", ".RB", ".RI", ".BI", ".IB", ".SM"):
                line = rest.replace('"', "")
            elif macro in (".PP", ".P", ".LP", ".sp", ".br", ".TP", ".IP"):
                line = "" if macro != ".IP" else None
            else:
                line = None
            if line is None:
                continue
        else:
            line = raw
        line = unroff(line).strip()
        if section == "NAME":
            name_lines.append(line)
        elif section == "DESCRIPTION":
            desc_lines.append(line)
    name = " ".join(" ".join(name_lines).split())
    if " - " not in name:
        return None
    summary = name.split(" - ", 1)[1].strip()
    text = "\n".join(desc_lines)
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    document = "\n\n".join(p for p in paras if p)
    return summary, document


def man_pairs():
    for sec in ("1", "8"):
        for path in sorted(glob.glob(f"/usr/share/man/man{sec}/*")):
            got = man_text(path)
            if not got:
                continue
            page = os.path.basename(path).split(".")[0]
            yield page, f"man:{page}.{sec}", got[1], got[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--seed", type=int, default=1, help="split seed (default 1)")
    ap.add_argument("--man", action="store_true", help="add the installed manual pages")
    ap.add_argument("--dumpavail", help="read this file instead of running apt-cache dumpavail")
    args = ap.parse_args()

    if args.dumpavail:
        with open(args.dumpavail, errors="replace") as f:
            dump = f.read()
    else:
        try:
            dump = subprocess.run(["apt-cache", "dumpavail"], check=True, capture_output=True,
                                  text=True, errors="replace").stdout
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"make_data: apt-cache dumpavail failed ({e}); run apt-get update first")
    sources = [("debian-packages", package_pairs(dump, translation_texts()))]
    if args.man:
        sources.append(("man-pages", man_pairs()))

    os.makedirs(args.out, exist_ok=True)
    files = {s: open(os.path.join(args.out, f"{s}.jsonl"), "w") for s in ("train", "valid", "test")}
    stats = {s: {} for s in files}
    seen = set()
    for source_name, pairs in sources:
        for group, pid, document, summary in pairs:
            if len(document.split()) < MIN_DOC_WORDS or not summary:
                continue
            if len(summary.split()) > MAX_SUMMARY_WORDS:
                continue
            document = document[:MAX_DOC_CHARS]
            key = hashlib.sha1(document.encode()).hexdigest()
            if key in seen:
                continue
            seen.add(key)
            split = split_of(group, args.seed)
            row = {"id": pid, "source": source_name, "document": document, "summary": summary}
            files[split].write(json.dumps(row, ensure_ascii=False) + "\n")
            stats[split][source_name] = stats[split].get(source_name, 0) + 1
    for f in files.values():
        f.close()
    with open(os.path.join(args.out, "stats.json"), "w") as f:
        json.dump({"seed": args.seed, "splits": stats}, f, indent=1)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
