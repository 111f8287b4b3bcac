"""The layers of ARCHITECTURE.md, enforced: each part of rsnet imports only the parts below it.

Parsed from the source (no import side effects); a new cross-layer import fails here with the
edge that broke the rule, and either the code or ARCHITECTURE.md must change.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "rsnet"

# part -> the parts it may import (the package root "rsnet" only re-exports, lazily)
ALLOWED: dict[str, set[str]] = {
    "streams": set(),
    "tck": {"streams"},
    "protocol": set(),
    "errors": {"protocol"},
    "client_rules": {"errors", "protocol"},
    "transport": {"errors"},
    "sync": {"client_rules", "errors", "protocol"},
    "net": {"client_rules", "errors", "protocol", "streams", "transport"},
    "broker": {"client_rules", "errors", "net", "protocol", "streams", "sync", "transport"},
    "spark": {"broker", "client_rules", "errors", "protocol", "sync"},
    "demo": {"rsnet", "broker", "errors", "net", "protocol", "streams"},
    "cli": {"broker", "client_rules", "demo", "errors", "net", "protocol", "streams", "sync"},
    "rsnet": {"errors", "net", "streams"},
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "rsnet"


def _imports() -> set[tuple[str, str, str]]:
    """(importing file, its part, the part it imports) for every rsnet import."""
    found = set()
    for path in ROOT.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    targets.append(".".join([*base, node.module] if node.module else base))
                elif node.module:
                    targets.append(node.module)
            elif isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            for target in targets:
                if target.split(".")[0] == "rsnet" and _part(target) != _part(module):
                    found.add((str(path.relative_to(ROOT.parent)), _part(module), _part(target)))
    return found


def test_every_part_has_a_place_in_the_layers():
    modules = (".".join(p.relative_to(ROOT.parent).with_suffix("").parts) for p in ROOT.rglob("*.py"))
    parts = {_part(module.removesuffix(".__init__")) for module in modules}
    assert parts <= set(ALLOWED), f"parts missing from ARCHITECTURE.md's table: {parts - set(ALLOWED)}"


def test_imports_only_go_down():
    broken = sorted(
        f"{path}: {part} imports {target}" for path, part, target in _imports() if target not in ALLOWED[part]
    )
    assert not broken, "\n".join(broken)
