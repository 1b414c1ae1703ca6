"""No function of the non-test sources runs past 80 lines unless a `// Long: <why>` comment above it says why
(tools/lint/long_functions.py), and the checker itself reads comments, literals and initializer braces right.
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT / "tools" / "lint" / "long_functions.py"


def check(*paths):
    return subprocess.run([sys.executable, str(CHECKER), *map(str, paths)], capture_output=True, text=True)


def function(name, body_lines, comment=""):
    body = "".join(f"  total += {n};\n" for n in range(body_lines))
    return f"{comment}int {name}(int total) {{\n{body}  return total;\n}}\n"


def test_no_unmarked_long_function_in_the_sources():
    result = check()
    assert result.returncode == 0, "functions over 80 lines without a `// Long:` reason:\n" + result.stdout


def test_a_long_function_is_reported_with_its_line_and_length(tmp_path):
    (tmp_path / "long.cpp").write_text("#include <cstdio>\n\n" + function("short_one", 10) + function("long_one", 88))
    result = check(tmp_path)
    assert result.returncode == 1
    assert result.stdout.strip() == "long.cpp:16: long_one is 91 lines"


def test_a_marked_long_function_is_allowed(tmp_path):
    marked = function("long_one", 88, comment="// Adds the table up.\n// Long: one step per table row.\n")
    (tmp_path / "marked.cpp").write_text(marked)
    assert check(tmp_path).returncode == 0
    (tmp_path / "marked.cpp").write_text(marked.replace("Long: one step per table row.", "Long:"))
    assert check(tmp_path).returncode == 1, "a marker without a reason does not count"


def test_braces_in_literals_comments_and_initializers_are_not_bodies(tmp_path):
    tricky = (
        'const char* open_brace = "{\\"{";\n'
        "const char close_brace = '}';\n"
        'const char* raw = R"json({"a": "}"})json";\n'
        "// a stray { in a comment\n"
        "/* and } another */\n"
        "const int million = 1'000'000;\n"
        "#define BLOCK(x) { x }\n"
        "namespace outer {\n"
        "struct Table {\n"
        "  int cells[3] = {1, 2, 3};\n"
        "  Table() : cells{4, 5, 6} {}\n"
        "};\n"
        + function("long_one", 88) +
        "}  // namespace outer\n"
    )
    (tmp_path / "tricky.cpp").write_text(tricky)
    result = check(tmp_path)
    assert result.stdout.strip() == "tricky.cpp:13: long_one is 91 lines"
    short = tricky.replace(function("long_one", 88), function("short_one", 20))
    (tmp_path / "tricky.cpp").write_text(short)
    assert check(tmp_path).returncode == 0


def test_test_folders_are_not_checked(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "long_test.cpp").write_text(function("long_test", 88))
    assert check(tmp_path).returncode == 0
