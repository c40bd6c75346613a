"""The systemd unit verifies and the launchd plist parses, with the keys the design needs."""

from __future__ import annotations

import configparser
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UNIT = REPO / "systemd" / "memd.service"
PLIST = REPO / "launchd" / "dev.memd.plist"


def unit_sections() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser


def test_unit_has_the_promised_settings() -> None:
    service = unit_sections()["Service"]
    assert service["Type"] == "notify"
    assert service["KillMode"] == "mixed"
    assert service["Restart"] == "on-failure"
    assert service["ExecStart"].split()[1:3] == ["run", "--config"]
    assert unit_sections()["Install"]["WantedBy"] == "default.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify checks that ExecStart exists, so point it at this checkout's memd.
    memd = Path(sys.executable).with_name("memd")
    assert memd.exists()
    unit = tmp_path / "memd.service"
    unit.write_text(UNIT.read_text().replace("%h/.local/bin/memd", str(memd)))
    out = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    problems = [line for line in (out.stdout + out.stderr).splitlines() if "memd.service" in line]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr


def test_launchd_plist_parses_with_keepalive_and_logs() -> None:
    plist = plistlib.loads(PLIST.read_bytes())
    assert plist["Label"] == "dev.memd"
    assert plist["ProgramArguments"][1:3] == ["run", "--config"]
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["StandardErrorPath"].endswith(".log")
    assert plist["StandardOutPath"].endswith(".log")
