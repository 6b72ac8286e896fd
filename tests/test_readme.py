"""README is the door: under 200 lines, with its status table and quick start; its layout section matches the
tree (every top-level entry described, every path it names exists)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_layout_matches_the_tree():
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("\n#", 1)[0]
    rows = [line for line in layout.splitlines() if line.startswith("| `")]
    named = {name.rstrip("/") for row in rows for name in re.findall(r"`([^`\s]+)`", row.split(" | ")[0])}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    top = {path.split("/")[0] for path in tracked} - {"README.md", ".gitignore", ".cfnlintrc.yaml", "pytest.ini"}
    top = {".ci/run" if name == ".ci" else name for name in top}
    assert sorted(top - named) == [], "top-level entries the layout section does not describe"
    for row in rows:
        folder = row.split(" | ")[0]
        for name in re.findall(r"`([^`\s]+)`", row.split(" | ")[1]):
            if re.fullmatch(r"[\w.-]+\.(py|sh)", name):  # a file the row says its folder holds
                hits = [p for p in tracked if p.endswith("/" + name) or p == name]
                assert hits, f"README layout names {name} ({folder}), which is not in the tree"
        for name in re.findall(r"`([^`\s]+)`", folder):
            assert (ROOT / name).exists(), f"README layout names {name}, which is not in the tree"


def test_readme_is_a_door_not_a_manual():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "README over 200 lines: move the detail into docs/ and link it"
    for heading in ("## Status: what is proven, and where", "## Quick start", "## From an empty account to a trained model",
                    "## Layout", "## Documentation"):
        assert heading in readme
    for doc in re.findall(r"\]\((docs/[\w.-]+\.md)", readme):
        assert (ROOT / doc).is_file(), f"README links {doc}, which does not exist"
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", readme.split("## Documentation", 1)[1]))
    assert linked == {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}, "every page of docs/ is linked from README"
