"""The documentation against what it documents: every option of every
command's --help is in pysbx(1) (under that command) and on a page of docs/;
every function of include/pysbx.h is in libpysbx(3) and docs/c-api.md; every
relative link of README.md and docs/ names a file that exists and, with
#anchor, a heading of it; the README is a front page (under 300 lines); and
its quick start prints, run for real, the output it shows.
usage: docs_check.py PATH/TO/pysbx SOURCE_DIR"""
import glob, os, re, subprocess, sys, tempfile

PYSBX, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
COMMANDS = ["run", "serve", "batch", "mcp", "doctor"]
fails = 0


def check(what, ok, detail=""):
    global fails
    print(("ok   " if ok else "FAIL ") + what + ("" if ok else ": " + detail))
    fails += 0 if ok else 1


def read(path):
    with open(os.path.join(SRC, path), encoding="utf-8") as f:
        return f.read()


def help_options(cmd):
    text = subprocess.run([PYSBX, cmd, "--help"], capture_output=True, text=True).stdout
    opts = set(re.findall(r"^  (?:-h, )?(--[a-z][a-z-]*)", text, re.M))
    opts.discard("--help")
    return opts


# --- the command: pysbx(1) and docs/ ---------------------------------------------
man1 = read("man/pysbx.1")
docs = {p: read(p) for p in sorted(os.path.relpath(q, SRC)
                                   for q in glob.glob(os.path.join(SRC, "docs", "*.md")))}
all_docs = "\n".join(docs.values())
for cmd in COMMANDS:
    opts = help_options(cmd)
    check(f"pysbx {cmd} --help lists options", len(opts) > 0, "none found")
    m = re.search(r'^\.SS "pysbx %s"\n(.*?)(?=^\.SS |^\.SH )' % cmd, man1, re.S | re.M)
    block = (m.group(1) if m else "").replace("\\-", "-")
    missing = sorted(o for o in opts if not re.search(r"^\.B %s\b" % re.escape(o), block, re.M))
    check(f"pysbx(1) documents every option of pysbx {cmd}", m is not None and not missing,
          f"missing {missing}" if m else "no section")
    missing = sorted(o for o in opts if f"`{o}" not in all_docs)
    check(f"docs/ documents every option of pysbx {cmd}", not missing, f"missing {missing}")

# --- the library: libpysbx(3) and docs/c-api.md ------------------------------------
header = read("include/pysbx.h")
funcs = set(re.findall(r"^PYSBX_API [^;(]*?\b(sbx_[a-z_]+)\(", header, re.M))
check("the header declares the API", len(funcs) >= 20, f"only {sorted(funcs)}")
man3 = read("man/libpysbx.3").replace("\\-", "-")
missing = sorted(f for f in funcs if not re.search(r"\b%s\b" % f, man3))
check("libpysbx(3) names every function of the header", not missing, f"missing {missing}")
capi = read("docs/c-api.md") + read("docs/sessions.md")
missing = sorted(f for f in funcs if not re.search(r"\b%s\b" % f, capi))
check("docs/c-api.md and docs/sessions.md name every function of the header", not missing,
      f"missing {missing}")


# --- links -----------------------------------------------------------------------
def slug(heading):
    """A heading's anchor as GitHub makes it."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(text):
    out, fence = set(), False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^#{1,6} (.*)$", line)):
            out.add(slug(m.group(1)))
    return out


bad = []
for page in ["README.md"] + list(docs):
    text = read(page)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue  # an absolute URL
        path, _, anchor = target.partition("#")
        where = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(os.path.join(SRC, where)):
            bad.append(f"{page}: {target} (no such file)")
        elif anchor and where.endswith(".md") and anchor not in anchors(read(where)):
            bad.append(f"{page}: {target} (no such heading)")
check("every relative link of README.md and docs/ resolves", not bad, "; ".join(bad))

# --- the README: a front page, and its quick start as shown ------------------------
readme = read("README.md")
lines = readme.count("\n")
check(f"README.md is a front page ({lines} lines)", lines < 300, "300 lines or more")
m = re.search(r"```sh\nscripts/setup && (build/pysbx run [^\n]*)\n```\n.*?```\n(.*?)```",
              readme, re.S)
check("the README shows its quick start and its output", m is not None, "not found")
if m:
    args = m.group(1).split()[1:]
    with tempfile.TemporaryDirectory() as out:
        args = [out if a == "out" else a for a in args]
        r = subprocess.run([PYSBX] + args, cwd=SRC, capture_output=True, text=True, timeout=120)
        check("the quick start prints what the README shows", r.stdout == m.group(2),
              f"printed {r.stdout!r} (stderr {r.stderr[-300:]!r}), shows {m.group(2)!r}")
        check("and its artifact comes back", os.path.exists(os.path.join(out, "summary.csv")),
              "no summary.csv")
sys.exit(1 if fails else 0)
