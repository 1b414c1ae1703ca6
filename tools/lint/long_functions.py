#!/usr/bin/env python3
"""Reports every function of the non-test C++ sources whose body is longer than 80 lines.

    tools/lint/long_functions.py [FILE_OR_FOLDER ...]      (default: the repository)

A body's length counts its lines from the opening brace to the closing one; lambdas and local classes count as part
of the function they sit in. A long function is allowed when the comment block directly above it (above its
template line, if it has one) holds the marker

    // Long: <why this function reads better whole>

Exit status: 0 when every long function is marked, 1 when one is not, 2 when a file's braces do not balance.
"""
import os
import re
import sys
from pathlib import Path

LIMIT = 80
SUFFIXES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
SKIPPED = {"tests", ".venv", "models", ".git", "third_party", "third-party", "external", "vendor"}
MARKER = re.compile(r"\bLong:\s*\S")

LITERAL_START = re.compile(r"//|/\*|\"|'")
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"?')
CHAR = re.compile(r"'(?:\\.|[^'\\\n])*'?")
RAW_PREFIX = re.compile(r"(?:^|[^\w])(?:u8|u|U|L)?R$")
RAW_OPEN = re.compile(r'"([^()\\\s]{0,16})\(')
NUMBER_SO_FAR = re.compile(r"(?:^|[^\w'])\d[\w']*$")
# What may follow a parameter list before a body: qualifiers, then a trailing return type.
AFTER_PARAMETERS = re.compile(
    r"\)\s*(?:(?:const|volatile|noexcept|override|final|mutable|try|&&?)\s*|noexcept\s*\(.*?\)\s*)*(?:->[^;{}]*)?$",
    re.S)
LAMBDA_WITHOUT_PARAMETERS = re.compile(r"[=(,]\s*\[[^\]]*\]\s*(?:mutable\s*)?$")
CONSTRUCTOR_INITIALIZERS = re.compile(r"\)\s*(?:noexcept\s*)?:(?!:).*[)}]$", re.S)
FUNCTION_SIGNATURE_ENDS = (AFTER_PARAMETERS, LAMBDA_WITHOUT_PARAMETERS, CONSTRUCTOR_INITIALIZERS)
SCOPE = re.compile(r"(?:template\s*<.*?>\s*)?(?:namespace|extern|class|struct|union|enum)\b", re.S)
ACCESS_LABELS = re.compile(r"\s*(?:(?:public|private|protected)\s*:(?!:)\s*)*")
BRACE_OR_SEMICOLON = re.compile(r"[{};]")
NAME = re.compile(r"((?:[\w~]+::)*(?:operator\s*\S+?|[\w~]+))\s*\(")
NOT_NAMES = {"alignas", "decltype", "__attribute__", "__launch_bounds__"}


def blank(text):
    return re.sub(r"[^\n]", " ", text)


def code_only(source):
    """The source with comments, literals and preprocessor lines blanked, newlines kept, so only code braces remain."""
    out, i = [], 0
    while (m := LITERAL_START.search(source, i)):
        start = m.start()
        out.append(source[i:start])
        if m.group() == "//":
            end = source.find("\n", start)
        elif m.group() == "/*":
            end = source.find("*/", start)
            end = end + 2 if end >= 0 else -1
        elif m.group() == '"' and RAW_PREFIX.search(source[max(0, start - 3):start]) \
                and (raw := RAW_OPEN.match(source, start)):
            end = source.find(")" + raw.group(1) + '"', raw.end())
            end = end + len(raw.group(1)) + 2 if end >= 0 else -1
        elif m.group() == "'" and NUMBER_SO_FAR.search(source[max(0, start - 40):start]):
            out.append("'")  # a digit separator, as in 1'000
            i = start + 1
            continue
        else:
            end = (STRING if m.group() == '"' else CHAR).match(source, start).end()
        end = len(source) if end < 0 else end
        out.append(blank(source[start:end]))
        i = end
    out.append(source[i:])
    lines = "".join(out).split("\n")
    continued = False
    for n, line in enumerate(lines):
        if continued or line.lstrip().startswith("#"):
            continued = line.rstrip().endswith("\\")
            lines[n] = ""
    return "\n".join(lines)


def matching_brace(code, at):
    depth = 0
    for m in re.finditer(r"[{}]", code[at:]):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return at + m.start()
    return -1


def function_bodies(code):
    """(signature offset, opening brace offset, closing brace offset) of each function defined in code."""
    scopes = []  # one entry per open brace outside a function body: "scope" (namespace, class) or "initializer"
    head, at = 0, 0
    while (m := BRACE_OR_SEMICOLON.search(code, at)):
        at = m.end()
        if m.group() == ";":
            if not scopes or scopes[-1] == "scope":
                head = at
        elif m.group() == "}":
            if scopes and scopes.pop() == "scope":
                head = at
        elif scopes and scopes[-1] == "initializer":
            scopes.append("initializer")
        else:
            start = ACCESS_LABELS.match(code, head).end()
            signature = code[start:m.start()].strip()
            if any(p.search(signature) for p in FUNCTION_SIGNATURE_ENDS):
                close = matching_brace(code, m.start())
                if close < 0:
                    raise ValueError("unbalanced braces")
                yield start, m.start(), close
                head = at = close + 1
            else:
                scopes.append("scope" if SCOPE.match(signature) else "initializer")
    if scopes:
        raise ValueError("unbalanced braces")


def is_marked(lines, first):
    """Whether the comment block directly above line index first holds the Long: marker."""
    n = first - 1
    while n >= 0 and lines[n].lstrip().startswith(("//", "/*", "*")):
        if MARKER.search(lines[n]):
            return True
        n -= 1
    return False


def long_functions(path):
    """(line, name, length, marked) of each function in path whose body is longer than LIMIT lines."""
    source = path.read_text(errors="replace")
    code, lines = code_only(source), source.split("\n")
    for start, open_at, close_at in function_bodies(code):
        length = code.count("\n", open_at, close_at) + 1
        if length > LIMIT:
            first = code.count("\n", 0, start)
            names = [n for n in NAME.findall(code, start, open_at) if n not in NOT_NAMES]
            yield first + 1, names[0] if names else "lambda", length, is_marked(lines, first)


def sources(root):
    if root.is_file():
        yield root
        return
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED and not d.startswith("build"))
        yield from (Path(folder) / f for f in sorted(files) if f.endswith(SUFFIXES))


def main(arguments):
    repository = Path(__file__).resolve().parents[2]
    roots = [Path(a) for a in arguments] or [repository]
    status = 0
    for root in roots:
        for path in sources(root):
            shown = path.relative_to(root) if root.is_dir() else path
            try:
                found = list(long_functions(path))
            except ValueError as error:
                print(f"{shown}: {error}")
                status = 2
                continue
            for line, name, length, marked in found:
                if not marked:
                    print(f"{shown}:{line}: {name} is {length} lines")
                    status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
