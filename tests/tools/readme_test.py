#!/usr/bin/env python3
"""The README's commands and numbers hold against the built binaries.

1. Every `zerod ...` / `zeroctl ...` command the README shows (in ```sh blocks, after `$ ` in
   output blocks, and in backticks in the text) names a subcommand that exists and only flags
   that subcommand's --help lists.
2. The short ones run: `zerod check` of every shown job file under configs/, and each
   `zeroctl plan` whose output or numbers the README quotes prints those numbers.
3. The demo (`tools/demo.sh` is `zerod train` with no job file) starts at the loss the README
   states and ends within the range it states.

Usage: readme_test.py SOURCE_DIR BUILD_DIR [--no-demo]
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

SRC, BUILD = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
RUN_DEMO = "--no-demo" not in sys.argv
BIN = {"zerod": os.path.join(BUILD, "engine", "zerod"),
       "zeroctl": os.path.join(BUILD, "tools", "zeroctl", "zeroctl")}
README = open(os.path.join(SRC, "README.md"), encoding="utf-8").read()
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def run(argv, cwd=SRC, timeout=120):
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def shown_commands():
    """(program, words) of each zerod/zeroctl command the README shows."""
    lines = []
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", README, re.S):
        for line in block.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                lines.append(line[2:])
            elif lang == "sh":
                lines.append(line)
    # In the text: code spans `zerod ...` / `zeroctl ...` (across a line break too).
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        if re.match(r"(zerod|zeroctl) ", span):
            lines.append(" ".join(span.split()))
    out = []
    for line in lines:
        line = line.split("  #")[0].split(" # ")[0].strip()
        for part in re.split(r"&&|\|", line):
            part = part.strip().rstrip("&").strip()
            m = re.search(r"(?:^|\s)(?:\S*/)?(zerod|zeroctl)(\s.*|$)", part)
            if not m or part.startswith(("cat ", "python", "#")):
                continue
            try:
                words = shlex.split(m.group(2))
            except ValueError:
                continue
            out.append((m.group(1), words))
    return out


HELP = {}


def help_of(program, sub):
    key = (program, tuple(sub))
    if key not in HELP:
        rc, text = run([BIN[program]] + list(sub) + ["--help"])
        HELP[key] = text if rc == 0 else None
    return HELP[key]


def subcommands(text):
    m = re.search(r"Subcommands:\n(.*?)(?:\n\n|$)", text, re.S)
    return [] if not m else [l.split()[0] for l in m.group(1).splitlines() if l.strip()]


def check_flags():
    checked = 0
    for program, words in shown_commands():
        sub = []
        rest = list(words)
        text = help_of(program, [])
        # Global options before the subcommand (zeroctl --addr X status).
        while rest and rest[0].startswith("-"):
            flag = rest.pop(0).split("=")[0]
            if flag not in text:
                fail(f"README: `{program} {' '.join(words)}`: {flag} is not an option of {program}")
            if rest and not rest[0].startswith("-") and rest[0] not in subcommands(text):
                rest.pop(0)
        while rest and rest[0] in subcommands(text):
            sub.append(rest.pop(0))
            text = help_of(program, sub)
        if not sub and program == "zerod" and rest and not rest[0].startswith("-"):
            fail(f"README: `{program} {' '.join(words)}`: '{rest[0]}' is not a zerod subcommand")
            continue
        for w in rest:
            if w.startswith("--"):
                flag = w.split("=")[0]
                if re.search(re.escape(flag) + r"\b", text) is None:
                    fail(f"README: `{program} {' '.join(words)}`: {flag} is not an option of "
                         f"`{program} {' '.join(sub)}`")
        checked += 1
    if checked < 20:
        fail(f"only {checked} zerod/zeroctl commands found in the README: the parser is broken")
    print(f"ok: {checked} zerod/zeroctl commands in the README name real subcommands and flags")


def check_configs():
    shown = sorted(set(re.findall(r"configs/[\w.-]+\.json", README)))
    if not shown:
        fail("the README shows no configs/*.json")
    for c in shown:
        if not os.path.exists(os.path.join(SRC, c)):
            fail(f"README names {c}, which does not exist")
            continue
        # --config-only: the example jobs name data, GPUs and NVMe paths of other machines.
        rc, out = run([BIN["zerod"], "check", "--config-only", c])
        if rc != 0:
            fail(f"zerod check {c}: exit {rc}\n{out[-2000:]}")
    print(f"ok: zerod check accepts the {len(shown)} job files the README names")


def check_plan_outputs():
    # The planner block: each table row shown (not "...") is a line of the real output.
    for block in re.findall(r"```\n(\$ zeroctl plan[^\n]*\n.*?)```", README, re.S):
        lines = block.splitlines()
        rc, out = run([BIN["zeroctl"]] + shlex.split(lines[0][2:])[1:])
        if rc != 0:
            fail(f"{lines[0]}: exit {rc}\n{out[-2000:]}")
            continue
        got = [" ".join(l.split()) for l in out.splitlines()]
        for want in lines[1:]:
            w = " ".join(want.split())
            if w and w != "..." and w not in got:
                fail(f"{lines[0]}: the README shows\n  {want}\nbut it prints\n{out}")
        print(f"ok: `{lines[0][2:]}` prints the {len(lines) - 1} lines the README shows")
    # Numbers quoted in the text after an inline plan command.
    for cmd, para in re.findall(r"`(zeroctl plan [^`]+)`([^`]*?)(?:\n\n|`)", README, re.S):
        numbers = re.findall(r"(\d+\.\d+ GiB)", para)
        if not numbers:
            continue
        cmd = " ".join(cmd.split())
        rc, out = run([BIN["zeroctl"]] + shlex.split(cmd)[1:])
        missing = [n for n in numbers if n not in out]
        if rc != 0 or missing:
            fail(f"README quotes {', '.join(missing)} for `{cmd}` (exit {rc}), which prints\n"
                 f"{out[-3000:]}")
        else:
            print(f"ok: `{cmd}` prints the {len(numbers)} numbers the README quotes")


def check_demo():
    m = re.search(r"the loss falls from ([\d.]+) .*? to about ([\d.]+), with a\s+validation loss "
                  r"of about ([\d.]+) \(both between ([\d.]+) and ([\d.]+)", README, re.S)
    if not m:
        fail("the README's demo paragraph (loss falls from X ... to about Y, with a validation "
             "loss of about Z (both between A and B ...) was not found")
        return
    first, last, val, low, high = map(float, m.groups())
    if not low <= last <= high or not low <= val <= high:
        fail(f"the README's demo numbers {last}, {val} are outside its own range {low}-{high}")
    with tempfile.TemporaryDirectory() as d:
        rc, out = run([BIN["zerod"], "train"], cwd=d, timeout=1200)
    done = re.search(r"loss ([\d.]+) -> ([\d.]+), val ([\d.]+)", out)
    if rc != 0 or not done:
        fail(f"the demo: exit {rc}\n{out[-3000:]}")
        return
    got_first, got_last, got_val = map(float, done.groups())
    # The first loss is the untrained model's (a uniform guess): close. The final ones depend on
    # the corpus (this project's text, which every commit changes): within the stated range.
    if abs(got_first - first) > 0.1:
        fail(f"the demo's first loss is {got_first}, the README says {first}")
    for name, g in (("final loss", got_last), ("validation loss", got_val)):
        if not low <= g <= high:
            fail(f"the demo's {name} is {g}, the README says between {low} and {high}")
    print(f"ok: the demo ends at loss {got_last}, val {got_val} (README: about {last} and {val}, "
          f"between {low} and {high})")


check_flags()
check_configs()
check_plan_outputs()
if RUN_DEMO:
    check_demo()
if failures:
    print(f"{len(failures)} README problems")
    sys.exit(1)
print("the README holds")
