"""The profile file: versioned JSON, written atomically, read back with one-line errors.

The format is described by ``profile.schema.json`` (generated from the model by ``schema.py``
and checked by the tests). Files of older versions are migrated on load (``migrate.py``); a file
from a newer cpuprof gets an error that says so, never a misreading.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ProfileFormatError
from . import codec
from .migrate import MIGRATIONS
from .profile import Profile

FORMAT = "cpuprof-profile"
VERSION = 2
PROFILE_FILENAME = "profile.json"


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, **codec.to_json(profile)}


def profile_from_dict(data: Any, source: str = "profile") -> Profile:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileFormatError(f"{source} is not a cpuprof profile (no '{FORMAT}' header)")
    version = data.get("version")
    if not isinstance(version, int) or version < 1:
        raise ProfileFormatError(f"{source} has no valid format version ({version!r})")
    if version > VERSION:
        raise ProfileFormatError(
            f"{source} was written by a newer cpuprof (profile format version {version}); this cpuprof reads "
            f"versions 1 to {VERSION}: upgrade cpuprof to read it"
        )
    try:
        while version < VERSION:
            data = MIGRATIONS[version](data)
            version += 1
        body = {k: v for k, v in data.items() if k not in ("format", "version")}
        profile = codec.from_json(Profile, body, "profile")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = exc.args[0] if isinstance(exc, codec.DecodeError) else f"{type(exc).__name__}: {exc}"
        raise ProfileFormatError(f"{source} is a damaged cpuprof profile ({what})") from exc
    profile.validate()
    return profile


def save(profile: Profile, path: str | os.PathLike[str]) -> Path:
    """Writes JSON atomically (temp file + rename): a crash mid-write never leaves half a file.

    ``path`` may be a directory (the file is ``profile.json`` in it) or a file name.
    """
    target = Path(path)
    if target.suffix != ".json":
        target.mkdir(parents=True, exist_ok=True)
        target = target / PROFILE_FILENAME
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".profile-", suffix=".tmp")
    try:
        # mkstemp creates the file 0600; a profile is as readable as any file the user writes.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as out:
            json.dump(profile_to_dict(profile), out, separators=(",", ":"))
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def load(path: str | os.PathLike[str]) -> Profile:
    """Reads a profile file, or ``profile.json`` inside a directory; one-line errors only."""
    source = Path(path)
    if source.is_dir():
        source = source / PROFILE_FILENAME
    try:
        text = source.read_text()
    except FileNotFoundError as exc:
        raise ProfileFormatError(f"{source}: no such profile (expected a directory written by cpuprof "
                                 f"or a {PROFILE_FILENAME})") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileFormatError(f"{source}: cannot read ({exc})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(
            f"{source}: not valid JSON at line {exc.lineno} column {exc.colno} (truncated or not a profile)"
        ) from exc
    return profile_from_dict(data, source=str(source))
