"""The README's Python example runs as written."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has no Python example"
    for code in blocks:
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("radix p16 lru ") and out[0].split()[3].endswith("%")
    assert len(out) == 2 and 0 < float(out[1].split()[0]) <= 1
