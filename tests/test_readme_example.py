"""The README's worked example runs as pasted (issue 26): its shell commands, in a fresh
folder, then its Python snippet on the run they made."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from helpers import ROOT


def _blocks(lang: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## A worked example", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.DOTALL)


def test_the_worked_example_runs_as_pasted(tmp_path):
    (shell,) = _blocks("bash")
    ran = []
    for line in shell.splitlines():
        cmd = line.split("#", 1)[0].strip()
        if not cmd or cmd.startswith("source "):
            continue
        argv = shlex.split(cmd)
        assert argv[0] == "dse", cmd
        r = subprocess.run([sys.executable, "-m", "dse", *argv[1:]], cwd=tmp_path,
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0, (cmd, r.stderr[-2000:])
        ran.append(argv[1])
    assert ran == ["run", "report", "whatif"]
    assert (tmp_path / "runs/quickstart/report/index.html").is_file()
    assert (tmp_path / "runs/quickstart/whatif/whatif.md").is_file()
    (snippet,) = _blocks("python")
    r = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usd_per_mtok_output_change" in r.stdout
