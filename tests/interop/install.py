"""`python tests/interop/install.py [NAME ...]`: put each peer (tests/interop/peers.py) in its
own venv under .interop/, unless the pinned version is there already."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.interop.peers import CONSTRAINTS, HOME, PEERS, installed  # noqa: E402


def install(name: str) -> None:
    venv = HOME / name
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as c:
        c.write("\n".join(CONSTRAINTS) + "\n")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "-c", c.name, PEERS[name].requirement],
                   check=True)
    Path(c.name).unlink()
    (venv / ".installed").write_text(PEERS[name].requirement)


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        print(f"install.py: unknown peer {unknown[0]!r}; valid: {', '.join(PEERS)}",
              file=sys.stderr)
        return 2
    for name in names or list(PEERS):
        if installed(name):
            print(f"{PEERS[name].requirement}: installed")
            continue
        t0 = time.monotonic()
        install(name)
        print(f"{PEERS[name].requirement}: installed in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
