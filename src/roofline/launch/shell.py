"""Just enough of a shell to read launch scripts: `NAME=value` and `NAME=( ... )` / `+=( ... )`
assignments (with `export`), `$NAME`, `${NAME}`, `${NAME:-default}`, `${ARR[@]}`, integer
`$(( ))`, and `if [[ "$X" == "lit" ]]` / `elif` / `else` / `fi` with ==, !=, -z, -n joined by
|| and &&. Nothing is executed; a command substitution `$(...)` stays unknown.

`script(text, target)` returns the variables and every command whose words match `target`
(e.g. `pretrain_gpt.py`), expanded into words.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass, field

_ASSIGN = re.compile(
    r"^(?:export\s+|local\s+|readonly\s+|declare(?:\s+-\w+)*\s+)?([A-Za-z_]\w*)(\+?)=(.*)$", re.S
)
_VAR = re.compile(r"\$\{([A-Za-z_]\w*|\d+)(\[[@*]\])?(?::?[-=]([^}]*))?\}|\$([A-Za-z_]\w*|\d)")
_ARITH = re.compile(r"\$\(\(([^()]*)\)\)")
_IF = re.compile(r"^(if|elif)\s+(.*?);?\s*then\s*$|^(else|fi)\s*$")


@dataclass
class Script:
    values: dict[str, str | list[str]] = field(default_factory=dict)
    commands: list[list[str]] = field(default_factory=list)
    unknown: set[str] = field(default_factory=set)  # variables read but never set
    guessed: list[str] = field(default_factory=list)  # conditions it could not decide

    def get(self, name: str) -> str | None:
        v = self.values.get(name)
        return " ".join(v) if isinstance(v, list) else v


def _statements(text: str) -> list[str]:
    """Logical lines: continuations joined, multi-line `( ... )` arrays joined."""
    joined = re.sub(r"\\\r?\n", " ", text)
    out: list[str] = []
    buf = ""
    for line in joined.splitlines():
        stripped = _strip_comment(line).strip()
        if buf:
            buf += " " + stripped
            if stripped.endswith(")") or stripped == ")":
                out.append(buf)
                buf = ""
            continue
        if re.match(r"^(?:export\s+)?[A-Za-z_]\w*\+?=\($", stripped) or (
            re.match(r"^(?:export\s+)?[A-Za-z_]\w*\+?=\(", stripped) and ")" not in stripped
        ):
            buf = stripped
            continue
        if stripped:
            out.append(stripped)
    if buf:
        out.append(buf)
    return out


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # inside quotes or a word is kept)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t") and not line[i:].startswith("#!"):
            if line[:i].strip().startswith("#SBATCH"):
                return line
            return line[:i]
    return line


class _Shell:
    def __init__(self) -> None:
        self.s = Script()

    def expand(self, text: str) -> str:
        def sub(m: re.Match) -> str:
            name = m.group(1) or m.group(4)
            default = m.group(3)
            v = self.s.get(name)
            if v is None or (v == "" and default is not None):
                if default is None:
                    self.s.unknown.add(name)
                    return m.group(0)
                return self.expand(default.strip("\"'"))
            return v

        out = _VAR.sub(sub, text)
        return _ARITH.sub(lambda m: _arith(m.group(1), m.group(0)), out)

    def words(self, text: str) -> list[str]:
        try:
            return shlex.split(self.expand(text))
        except ValueError:
            return self.expand(text).split()

    def assign(self, name: str, append: bool, value: str) -> None:
        if value.startswith("(") and value.rstrip().endswith(")"):
            items = [w for item in self.words(value.strip()[1:-1]) for w in item.split()]
            old = self.s.values.get(name, []) if append else []
            self.s.values[name] = (old if isinstance(old, list) else [old]) + items
            return
        if value.startswith("$(") and not value.startswith("$(("):
            self.s.values[name] = value  # a command substitution: unknown
            return
        ws = self.words(value) if value else [""]
        v = " ".join(ws)
        self.s.values[name] = ((self.s.get(name) or "") + v) if append else v


def _arith(expr: str, original: str) -> str:
    """`$(( expr ))` of whole numbers with + - * / % and parentheses, else unchanged."""
    try:
        return str(_int_expr(ast.parse(expr.replace("$", "").strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError):
        return original


_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a // b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


def _int_expr(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_int_expr(node.left), _int_expr(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_int_expr(node.operand)
    raise ValueError("not integer arithmetic")


def _condition(sh: _Shell, cond: str) -> bool | None:
    """The value of a simple `[[ ... ]]` test, None if it is not one."""
    cond = cond.strip()
    for sep, fn in (("||", any), ("&&", all)):
        parts = re.split(r"(?<=\])\s*" + re.escape(sep) + r"\s*(?=\[)", cond)
        if len(parts) > 1:
            vals = [_condition(sh, c) for c in parts]
            return None if None in vals else fn(vals)
    m = re.fullmatch(r"\[\[?\s*(.*?)\s*\]\]?", cond)
    if not m:
        return None
    body = m.group(1)
    for part_sep, fn in (("||", any), ("&&", all)):
        if part_sep in body:
            vals = [_condition(sh, f"[[ {p} ]]") for p in body.split(part_sep)]
            return None if None in vals else fn(vals)
    w = sh.words(body)
    if w and w[0] == "!":
        inner = _condition(sh, "[[ " + " ".join(shlex.quote(x) for x in w[1:]) + " ]]")
        return None if inner is None else not inner
    if len(w) == 2 and w[0] in ("-f", "-d", "-e", "-x", "-r", "-s"):
        return True  # the files a launch script checks for are taken to exist
    if len(w) == 3 and w[1] in ("==", "=", "!="):
        return (w[0] == w[2]) == (w[1] != "!=")
    if len(w) == 2 and w[0] in ("-z", "-n"):
        return (w[1] == "") == (w[0] == "-z")
    if len(w) == 1 and w[0] in ("-z", "-n"):
        return w[0] == "-z"
    return None


def script(text: str, target: re.Pattern[str]) -> Script:
    sh = _Shell()
    stack: list[list[bool]] = []  # per open if: [this branch active, some branch taken]
    for st in _statements(text):
        m = _IF.match(st)
        if m:
            _branch(sh, stack, m)
            continue
        if stack and not all(b[0] for b in stack):
            continue
        a = _ASSIGN.match(st)
        if a and " " not in st.split("=", 1)[0].strip().split()[-1]:
            sh.assign(a.group(1), a.group(2) == "+", a.group(3).strip())
            continue
        words = [w for word in sh.words(st) for w in word.split()]
        if any(target.search(w) for w in words):
            sh.s.commands.append(words)
    return sh.s


def _branch(sh: _Shell, stack: list[list[bool]], m: re.Match) -> None:
    kw = m.group(1) or m.group(3)
    if kw == "fi":
        if stack:
            stack.pop()
        return
    if kw == "else":
        if stack:
            stack[-1][0] = not stack[-1][1]
            stack[-1][1] = True
        return
    outer = all(b[0] for b in stack[:-1]) if kw == "elif" else all(b[0] for b in stack)
    val = _condition(sh, m.group(2)) if outer else False
    if val is None:
        sh.s.guessed.append(m.group(2))
        val = kw == "if"  # undecidable: the first branch is taken
    if kw == "if":
        stack.append([bool(val), bool(val)])
    elif stack:
        taken = stack[-1][1]
        stack[-1][0] = bool(val) and not taken
        stack[-1][1] = taken or bool(val)
