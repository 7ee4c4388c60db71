"""Every sample of real output in the docs, generated from the code that makes it.

The README and ``docs/*.md`` mark each sample::

    <!-- sample:NAME -->
    ```
    ...what the commands print...
    ```
    <!-- /sample -->

(or inline, ``<!-- sample:NAME -->$0.197<!-- /sample -->``). ``python -m tools.docsamples``
(``make docs``) runs the commands behind every sample in a scratch folder, on the bundled
worlds as released and the checkout's ``config.toml``, and rewrites the marked text.
``--check`` rewrites nothing and exits 1 naming each sample that drifted, with a diff
(a test runs it). The offline model is deterministic, so only wall-clock times differ
from run to run: they are masked (``#.##s``).
"""

from __future__ import annotations

import argparse
import csv
import difflib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the marked text: NAME and what stands between the markers now
MARK = re.compile(r"<!-- sample:(?P<name>[\w.-]+) -->(?P<body>.*?)<!-- /sample -->", re.S)
#: what stands for a wall-clock time in a sample
MASK = "#.##"

Samples = dict[str, str]


def doc_files(repo: Path = REPO) -> list[Path]:
    """The files that may hold samples: the README and docs/*.md."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def block(text: str, lang: str = "") -> str:
    """A sample's text as the fenced block between its markers (lines without trailing
    spaces, which editors strip)."""
    lines = "\n".join(line.rstrip() for line in text.rstrip().splitlines())
    return f"\n```{lang}\n{lines}\n```\n"


def mask_wall(text: str) -> str:
    """Wall-clock times (``wall 0.09s``, a tune row's ``   0.47s``) masked, keeping each
    column's width: the only part of an offline run that differs between runs."""
    text = re.sub(r"wall \d+\.\d+s", f"wall {MASK}s", text)
    column = re.compile(r"(?<= ) +\d+\.\d+s(?= |$)", re.M)
    return column.sub(lambda m: f"{MASK}s".rjust(len(m.group())), text)


@dataclass
class Scratch:
    """A scratch folder holding the bundled worlds as released (``worlds/``) and the
    checkout's ``config.toml``, where samples' commands run as a user would type them."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def make(cls, parent: Path, name: str) -> Scratch:
        from sim.testing.worlds import pristine_worlds

        root = parent / name
        pristine_worlds(REPO, root)
        shutil.copy(REPO / "config.toml", root / "config.toml")
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.endswith("_API_KEY") and not key.startswith("SIM")
        }
        env.update(PYTHONPATH=str(REPO), NO_COLOR="1", PYTHONHASHSEED="0", COLUMNS="100")
        return cls(root, env)

    def run(
        self, *args: str, stdin: str = "", code: int | None = 0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``sim ARGS`` in the scratch folder; its exit code must be ``code``."""
        done = subprocess.run(
            [sys.executable, "-m", "sim", *args],
            cwd=self.root,
            env={**self.env, **(env or {})},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if code is not None and done.returncode != code:
            raise RuntimeError(
                f"sim {' '.join(args)} exited {done.returncode}, not {code}:\n{done.stderr}"
            )
        return done

    def sim(self, *args: str) -> str:
        """The stdout of ``sim ARGS`` (which must succeed)."""
        return self.run(*args).stdout

    def copy(self, world: str, to: str) -> None:
        shutil.copytree(self.root / "worlds" / world, self.root / to)

    def head(self, rel: str, lines: int) -> str:
        with (self.root / rel).open(encoding="utf-8") as handle:
            return "".join(handle.readline() for _ in range(lines))


def _masked_csv(text: str, column: str) -> str:
    """CSV text with ``column``'s values masked (a call's latency is wall-clock time)."""
    rows = list(csv.reader(io.StringIO(text)))
    at = rows[0].index(column)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for n, row in enumerate(rows):
        if n and row[at]:
            row[at] = MASK
        writer.writerow(row)
    return out.getvalue()


# -- the samples ------------------------------------------------------------------------------
# Each scenario runs its commands once and gives the samples they show, by name.

Scenario = Callable[[Path], Samples]
SCENARIOS: list[Scenario] = []


def scenario(func: Scenario) -> Scenario:
    SCENARIOS.append(func)
    return func


@scenario
def make_demo(tmp: Path) -> Samples:
    """README: what `make demo` shows of the demo world's third tick."""
    s = Scratch.make(tmp, "make-demo")
    s.copy("demo", ".demo/world")
    out = s.sim("tick", "--world", ".demo/world", "--ticks", "3")
    third = out[out.index("== tick 3 ==") :]
    return {"readme-demo": block(mask_wall(third))}


@scenario
def five_ticks(tmp: Path) -> Samples:
    """The demo world after five offline ticks: export, the tables in pandas, interviews."""
    s = Scratch.make(tmp, "five-ticks")
    s.copy("demo", "world")
    s.sim("tick", "--world", "world", "--ticks", "5")
    export = s.sim("export", "--world", "world", "--out", "tables")
    samples = {
        "readme-export": block(
            "$ sim export --world world --out tables          # --format csv|jsonl|parquet, "
            f"--from/--to\n{export}"
        ),
        "analysis-export": block(
            "$ cp -r worlds/demo world && sim tick --world world --ticks 5\n"
            f"$ sim export --world world --out tables\n{export}"
            f"$ head -3 tables/interactions.csv\n{s.head('tables/interactions.csv', 3)}"
            "$ head -3 tables/calls.csv\n"
            f"{_masked_csv(s.head('tables/calls.csv', 3), 'latency')}",
            "console",
        ),
    }
    samples.update(_pandas(s))
    asked_pell = s.run("ask", "--world", "world", "pell", "Where were you last night?")
    asked = asked_pell.stdout + asked_pell.stderr  # the answer, then where it was recorded
    survey = s.sim(
        "ask", "--world", "world", "--all", "Who should be the next master glassblower?", "--json"
    )
    firsts = [
        json.dumps(
            {"character": a["character"], "answer": a["answer"][:70], "usage": a["usage"]},
            separators=(",", ":"),
            ensure_ascii=False,
        )
        for a in json.loads(survey)["answers"][:2]
    ]
    usage = s.sim("usage", "--world", "world", "--by", "phase")
    samples["analysis-ask"] = block(
        f'$ sim ask --world world pell "Where were you last night?"\n{asked}'
        '$ sim ask --world world --all "Who should be the next master glassblower?" --json \\\n'
        "    | jq -c '.answers[:2][] | {character, answer: .answer[:70], usage}'\n"
        + "\n".join(firsts)
        + f"\n$ sim usage --world world --by phase\n{usage}",
        "console",
    )
    return samples


#: docs/analysis.md's pandas example, run as it is written there
PANDAS = """\
import sim.analysis

frames = sim.analysis.load("world")          # or load("world", first=2, last=4)
chars = frames.characters
print(chars.shape)
print(chars.groupby("tick")["action"].value_counts().unstack(fill_value=0))
print(chars[chars.character == "ada"][["tick", "location", "mood", "action", "target"]]
      .to_string(index=False))
print(frames.interactions.query("kind == 'speech'")
      .groupby(["from", "to"]).size().sort_values(ascending=False).head(5))
print(frames.calls.groupby("phase")[["input_tokens", "output_tokens", "cost_usd"]].sum())
"""


def _pandas(s: Scratch) -> Samples:
    done = subprocess.run(
        [sys.executable, "-c", PANDAS],
        cwd=s.root,
        env=s.env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return {"analysis-pandas-code": block(PANDAS, "python"), "analysis-pandas": block(done.stdout)}


@scenario
def cli_json(tmp: Path) -> Samples:
    """docs/cli-json.md: `sim init`, then check and tick with --json, and a failure."""
    s = Scratch.make(tmp, "cli-json")
    s.sim("init", "w")
    check = s.sim("check", "--world", "w", "--json")
    ticks = [json.loads(line) for line in s.sim("tick", "--world", "w", "--ticks", "2", "--json")
             .splitlines()]  # fmt: skip
    picked = [
        json.dumps(
            {
                "tick": t["tick"],
                "calls": t["calls"],
                "failures": t["failures"],
                "tokens": t["usage"]["input_tokens"],
            },
            separators=(",", ":"),
        )
        for t in ticks
    ]
    missing = s.run("check", "--world", "missing", "--json", code=2)
    text = (
        f"$ sim init w\n$ sim check --world w --json\n{check}"
        "$ sim tick --world w --ticks 2 --json 2>/dev/null | jq -c '{tick, calls, failures, "
        "tokens: .usage.input_tokens}'\n" + "\n".join(picked) + "\n"
        f'$ sim check --world missing --json; echo "exit $?"\n'
        f"{missing.stderr}{missing.stdout}exit {missing.returncode}\n"
    )
    return {"cli-json": block(text, "console")}


TUNE = ("tune", "--world", "worlds/demo", "--depths", "0,1,2,4", "--ticks", "5")


def _tune_cost(table: str) -> float:
    """The sum of a tune table's cost column."""
    return sum(float(m) for m in re.findall(r"\$(\d+\.\d+)", table))


@scenario
def tune(tmp: Path) -> Samples:
    """docs/tuning.md: two phases offline, one against the stub server, the estimate."""
    from sim.testing.stub_server import ServerThread, StubServer

    s = Scratch.make(tmp, "tune")
    samples: Samples = {}
    for phase, name in (("phase2a", "tune-resolution"), ("phase1", "tune-intentions")):
        out = s.sim(*TUNE, "--phase", phase)
        command = f"$ sim tune --world worlds/demo --phase {phase} --depths 0,1,2,4 --ticks 5"
        samples[name] = block(f"{command}\n{mask_wall(out)}")
    key = {"OPENAI_API_KEY": "any"}  # as the sample shows it: the stub takes any key
    with ServerThread(StubServer()) as server:
        url = ("--provider", "openai", "--base-url", server.base_url)
        out = s.run(*TUNE, "--phase", "phase2a", *url, "--yes", env=key).stdout
        asked = s.run(*TUNE, "--phase", "phase2a", *url, stdin="n\n", code=None, env=key)
    samples["tune-stub"] = block(
        "$ OPENAI_API_KEY=any sim tune --world worlds/demo --phase phase2a --depths 0,1,2,4 \\\n"
        "      --ticks 5 --provider openai --base-url http://127.0.0.1:8765/v1 --yes\n"
        + mask_wall(out)
    )
    question = asked.stderr[asked.stderr.index("sim tune will run") :]
    question = question[: question.index("[y/N]:") + len("[y/N]:")]
    samples["tune-estimate"] = block(question)
    estimate = re.search(r"cost \$(\d+\.\d+)", question)
    assert estimate is not None, question
    samples["tune-estimate-usd"] = f"${float(estimate.group(1)):.3f}"
    samples["tune-stub-usd"] = f"${_tune_cost(out):.3f}"
    depth4 = samples["tune-resolution"].rstrip("`\n").splitlines()[-1].split()
    samples["tune-resolution-window4"] = depth4[-1]  # the avg window at depth 4
    return samples


@scenario
def tune_memory(tmp: Path) -> Samples:
    """docs/tuning.md: the minds world's intentions, window against retrieve, offline."""
    s = Scratch.make(tmp, "tune-memory")
    args = ("--world", "worlds/minds", "--phase", "intentions", "--memory", "window,retrieve")
    out = s.sim("tune", *args, "--ticks", "3")
    return {"tune-memory": block(f"$ sim tune {' '.join(args)} --ticks 3\n{mask_wall(out)}")}


@scenario
def harvest_vote_calls(tmp: Path) -> Samples:
    """docs/phases.md: the vote phase's calls, with tools, in a tick's log."""
    s = Scratch.make(tmp, "hv")
    s.copy("harvest-vote", "hv")
    config = s.root / "hv" / "config.toml"  # as the doc says: the vote phase with tools
    text = config.read_text()
    assert "[phases.vote]\n" in text
    config.write_text(
        text.replace(
            "[phases.vote]\n",
            '[phases.vote]\ntools = ["look", "recall", "inventory"]\nmax_tool_steps = 2\n',
        )
    )
    s.sim("tick", "--world", "hv")
    calls = s.sim("log", "--world", "hv", "--tick", "1", "--calls")
    picked = [line for line in calls.splitlines() if re.match(r"1:vote:vote:(ana|ruth):", line)]
    return {
        "phases-vote-calls": block(
            "$ sim log --world hv --tick 1 --calls | grep -E '^1:vote:vote:(ana|ruth):'\n"
            + "\n".join(picked)
        )
    }


@scenario
def harvest_vote_five(tmp: Path) -> Samples:
    """README: five offline ticks of harvest-vote, the last one, its votes, the usage."""
    s = Scratch.make(tmp, "hv-five")
    s.copy("harvest-vote", "hv")
    out = s.sim("tick", "--world", "hv", "--ticks", "5")
    log = s.sim("log", "--world", "hv", "--tick", "5")
    usage = s.sim("usage", "--world", "hv", "--by", "phase")
    return {
        "readme-hv-tick5": block(mask_wall(out[out.index("== tick 5 ==") :])),
        "readme-hv-votes": block(log[log.rindex("[vote]") :].split("\n\n")[0]),
        "readme-hv-usage": block(usage),
    }


@scenario
def interventions(tmp: Path) -> Samples:
    """README: `sim inject` and `sim set` before a tick, its log and its replay."""
    s = Scratch.make(tmp, "interventions")
    s.copy("demo", "world")  # the README's own scratch copy (`cp -r worlds/demo world`)
    s.sim("tick", "--world", "world", "--ticks", "2")
    inject = ("inject", "--world", "world", "--at", "quay", "A storm breaks over the quay.")
    injected = s.sim(*inject)
    setting = s.sim("set", "--world", "world", 'bram.state.mood="soaked"')
    s.sim("tick", "--world", "world")
    log = s.sim("log", "--world", "world", "--tick", "3").splitlines()
    told = [line for line in log if line.startswith("intervention ")]
    quay = log.index("[Herring Quay]")
    end = next(
        (n for n in range(quay + 1, len(log)) if not log[n] or log[n].startswith(" ")), len(log)
    )
    scene = log[quay:end]  # the place's narrative, not the intentions listed after it
    replay = s.sim("replay", "--world", "world", "--tick", "3")
    text = (
        f'$ sim inject --world world --at quay "A storm breaks over the quay."\n{injected}'
        "$ sim set --world world 'bram.state.mood=\"soaked\"'      # the value is JSON\n"
        f"{setting}$ sim tick --world world\n...\n$ sim log --world world --tick 3\n"
        + "\n".join([log[0], *told, "...", *scene])
        + f"\n$ sim replay --world world --tick 3\n{replay}"
    )
    return {"readme-interventions": block(text)}


#: docs/analysis.md's sweep: custom state fields given to `sim init`'s characters
SWEEP_FIELDS = {
    "ada": {"coins": 5, "faction": "river"},
    "bram": {"coins": 8, "faction": "river"},
    "cora": {"coins": 11, "faction": "town"},
}


@scenario
def sweep(tmp: Path) -> Samples:
    """docs/analysis.md: a sweep of three seeds by two settings, and its report."""
    s = Scratch.make(tmp, "sweep")
    s.sim("init", "w")
    for cid, fields in SWEEP_FIELDS.items():
        path = s.root / "w" / "characters" / f"{cid}.json"
        data = json.loads(path.read_text())
        data["state"].update(fields)
        path.write_text(json.dumps(data, indent=2) + "\n")
    args = ("--seeds", "1-3", "--set", "phase1.temperature=0.5,0.9", "--ticks", "5")
    done = s.run("sweep", "--world", "w", *args, "--out", "runs", "--jobs", "2")
    lines = (done.stderr + done.stdout).splitlines()
    # the runs finish in whichever order two jobs make: two of them, sorted, then "..."
    finished = sorted(line for line in lines if line.startswith("done "))
    others = [line for line in lines if not line.startswith("done ")]
    report = s.sim("sweep", "report", "--runs", "runs")
    text = (
        f"$ sim sweep --world w {' '.join(args)} --out runs --jobs 2\n"
        + "\n".join([others[0], *finished[:2], "...", *others[1:]])
        + f"\n$ sim sweep report --runs runs\n{report}"
    )
    return {"analysis-sweep": block(text, "console")}


PEOPLE = "field,tick,value\n" + "".join(
    f"survey,6,{answer}\n"
    for answer in ("yes", "no", "no", "yes", "no", "no", "no", "yes", "no", "no")
)


@scenario
def study_compare(tmp: Path) -> Samples:
    """docs/analysis.md: sim study compare on the worked study, against arms and people."""
    s = Scratch.make(tmp, "compare")
    shutil.copytree(REPO / "examples" / "harvest-study", s.root / "examples" / "harvest-study")
    s.run(
        "study", "run", "examples/harvest-study/study.toml", "--out", "harvest-runs", "--jobs", "2"
    )
    arms = s.sim("study", "compare", "harvest-runs")
    stance = s.sim(
        "study", "compare", "harvest-runs", "--field", "stance=keep", "--tick", "3", "--tick", "6"
    )
    (s.root / "people.csv").write_text(PEOPLE)
    people = s.sim("study", "compare", "harvest-runs", "--reference", "people.csv")
    (s.root / "bad.csv").write_text("field,tick,value\nsurvey,6,yes\nsurvey,six,no\n")
    bad = s.run("study", "compare", "harvest-runs", "--reference", "bad.csv", code=2).stderr
    row = json.loads(s.sim("study", "compare", "harvest-runs", "--json"))["comparisons"][-1]
    verified = s.sim("study", "verify", "harvest-runs")
    arm = sorted(
        p.parent
        for p in (s.root / "harvest-runs").glob("*/*/world.json")
        if not p.parent.parent.name.startswith("_")
    )[0]
    edited = sorted((arm / "characters").glob("*.json"))[0]
    data = json.loads(edited.read_text())
    data["identity"]["description"] += " (edited)"
    edited.write_text(json.dumps(data, indent=2) + "\n")
    unverified = s.run("study", "verify", "harvest-runs", code=1)
    shown = edited.relative_to(s.root)
    return {
        "analysis-verify": block(
            f"$ sim study verify harvest-runs\n{verified}"
            f"$ # edit {shown} by hand, then\n"
            f"$ sim study verify harvest-runs\n{unverified.stdout}{unverified.stderr}",
            "console",
        ),
        "analysis-compare": block(
            f"$ sim study compare harvest-runs\n{arms}"
            f"$ sim study compare harvest-runs --field stance=keep --tick 3 --tick 6\n{stance}",
            "console",
        ),
        "analysis-compare-json": block(json.dumps(row, indent=1, ensure_ascii=False), "json"),
        "analysis-reference": block(
            "$ head -4 people.csv\n"
            + "".join(PEOPLE.splitlines(keepends=True)[:4])
            + f"...\n$ sim study compare harvest-runs --reference people.csv\n{people}"
            f"$ sim study compare harvest-runs --reference bad.csv\n{bad}",
            "console",
        ),
    }


def _aware(topic: dict[str, object], at: int) -> str:
    ticks = topic["awareness"]
    assert isinstance(ticks, list)
    row = ticks[at]
    return ", ".join(str(a) for a in row["aware"]) + f" ({100 * row['share']['mean']:.0f}%)"


@scenario
def diffusion(tmp: Path) -> Samples:
    """docs/analysis.md: examples/diffusion offline, its report beside the paper's."""
    s = Scratch.make(tmp, "diffusion")
    shutil.copytree(REPO / "examples" / "diffusion", s.root / "examples" / "diffusion")
    s.run("study", "run", "examples/diffusion/study.toml", "--out", "diffusion-runs", "--jobs", "2")
    script = [sys.executable, "examples/diffusion/report.py", "diffusion-runs"]
    env = {**s.env}
    text = subprocess.run(
        script, cwd=s.root, env=env, capture_output=True, text=True, check=True, timeout=600
    ).stdout
    data = json.loads(
        subprocess.run(
            [*script, "--json"], cwd=s.root, env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    party, candidacy = data["topics"]
    answers = sum(t["answers"] for t in data["topics"])
    wrong = sum(t["hallucinated"] for t in data["topics"])
    density = data["density"]
    runs, ticks = len(data["runs"]), len(density) - 1
    table = (
        f"| | Park et al. 2023 (gpt-3.5-turbo, 2 game days) | this study, offline provider "
        f"({runs} seeds, {ticks} ticks) |\n|---|---|---|\n"
        f"| party: aware at the start → at the end | 1 → 13 of 25 (4% → 52%) | "
        f"{_aware(party, 0)} → {_aware(party, -1)} of 25 |\n"
        f"| candidacy: aware at the start → at the end | 1 → 8 of 25 (4% → 32%) | "
        f"{_aware(candidacy, 0)} → {_aware(candidacy, -1)} of 25 |\n"
        f"| network density | 0.167 → 0.74 | {density[0]['mean']:.3f} → "
        f"{density[-1]['mean']:.3f} |\n"
        f"| awareness answers hallucinated | 1.3% | {100 * wrong / answers:.1f}% "
        f"({wrong:,} of {answers:,}) |"
    )
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("hallucinated: "))
    network = lines.index("network density (relationships, directed)")
    cut = [*lines[:6], "...", *lines[first - 1 : first + 1], "...", *lines[network : network + 2]]
    cut += ["...", lines[-1]]
    return {
        "analysis-diffusion-table": f"\n{table}\n",
        "analysis-diffusion": block(
            "$ python examples/diffusion/report.py diffusion-runs\n" + "\n".join(cut), "console"
        ),
    }


# -- rewriting the docs -----------------------------------------------------------------------


def generate(only: Iterable[str] = ()) -> Samples:
    """Every sample, freshly made (only the scenarios named in ``only``, if any)."""
    wanted = set(only)
    samples: Samples = {}
    with tempfile.TemporaryDirectory(prefix="sim-docsamples-") as tmp:
        for make in SCENARIOS:
            if not wanted or make.__name__ in wanted:
                samples.update(make(Path(tmp)))
    return samples


def used(paths: Iterable[Path]) -> dict[Path, list[str]]:
    """The sample names each file marks."""
    return {path: [m["name"] for m in MARK.finditer(path.read_text())] for path in paths}


def rewrite(text: str, samples: Samples, where: str, partial: bool = False) -> str:
    """``text`` with each marked sample replaced by its fresh text (``partial``: samples
    not given are left as they are, else they are an error)."""

    def one(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in samples:
            if partial:
                return match.group()
            raise KeyError(f"{where}: no scenario gives the sample {name!r}")
        return f"<!-- sample:{name} -->{samples[name]}<!-- /sample -->"

    return MARK.sub(one, text)


def drifted(paths: Iterable[Path], samples: Samples, partial: bool = False) -> dict[Path, str]:
    """Each file whose marked samples differ from ``samples``, with a unified diff."""
    out: dict[Path, str] = {}
    for path in paths:
        now = path.read_text()
        fresh = rewrite(now, samples, str(path), partial)
        if fresh != now:
            out[path] = "".join(
                difflib.unified_diff(
                    now.splitlines(keepends=True),
                    fresh.splitlines(keepends=True),
                    str(path),
                    f"{path} (generated)",
                )
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docsamples", description=__doc__)
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 on drift")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        choices=[make.__name__ for make in SCENARIOS],
        help="run only this scenario (repeatable); the others' samples are left as they are",
    )
    args = parser.parse_args(argv)
    paths = [p for p, names in used(doc_files()).items() if names]
    samples = generate(args.only)
    try:
        return _apply(paths, samples, check=args.check, partial=bool(args.only))
    except KeyError as exc:  # a marker no scenario fills
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2


def _apply(paths: list[Path], samples: Samples, *, check: bool, partial: bool) -> int:
    if check:
        stale = drifted(paths, samples, partial)
        for path, diff in stale.items():
            print(f"drifted: {path.relative_to(REPO)} (run `make docs`)\n{diff}")
        return 1 if stale else 0
    for path in paths:
        text = path.read_text()
        fresh = rewrite(text, samples, str(path), partial)
        if fresh != text:
            path.write_text(fresh)
            print(f"rewrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
