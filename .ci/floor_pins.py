"""The floors .ci/floors installs: for the Python that runs this, each requirement of pyproject.toml's
[project] dependencies and test extra whose marker holds, pinned (==) to its `>=` floor; a name
listed twice gets its highest floor. Reads pyproject.toml on stdin; the arguments are names to leave
out. Uses pip's vendored parsers, so that a bare venv runs it (3.10 has no tomllib)."""

import sys

try:
    import tomllib
except ImportError:   # 3.10
    from pip._vendor import tomli as tomllib
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.version import Version


def floor_pins(pyproject: str, leave_out=()) -> list:
    project = tomllib.loads(pyproject)["project"]
    pins = {}
    for line in project["dependencies"] + project.get("optional-dependencies", {}).get("test", []):
        req = Requirement(line)
        if req.name in leave_out or (req.marker is not None and not req.marker.evaluate()):
            continue
        floors = [s.version for s in req.specifier if s.operator == ">="]
        if len(floors) != 1:
            raise SystemExit(f"floors: {line!r} has no single >= floor")
        pins[req.name] = max(pins.get(req.name, floors[0]), floors[0], key=Version)
    return [f"{name}=={floor}" for name, floor in pins.items()]


if __name__ == "__main__":
    print("\n".join(floor_pins(sys.stdin.read(), sys.argv[1:])))
