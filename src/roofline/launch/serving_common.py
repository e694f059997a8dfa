"""What the serving readers share: the engines' defaults tables, their command lines read with
argparse's own rules, and the one record (`Reading`) each reader fills before it becomes a
`LaunchConfig` of kind 'serving'.

A serving launch line (`vllm serve`, `python -m sglang.launch_server`, `trtllm-serve`) states one
server: its GPUs split as tensor x pipeline (x attention-data) parallel, its experts split over
some of them, its limits (sequences in flight, tokens per step, context length) and its dtypes.
The project's plan vocabulary is `serve --plan` (tp, pp, dp = attention data parallel inside the
replica, ep) over `chips` GPUs: the server's GPUs times the replicas it runs (a dense model's
`--data-parallel-size` copies the whole server).

Each engine's table (`launch/defaults/<engine>.toml`) holds the flags it knows (so a misspelt
flag is named with the closest one), the defaults it fills (each with its source file and line),
its quantization methods and KV-cache dtypes in the project's dtype names, and the flags that have
no bearing on the cost (front end, logging, tokenizer), which are read and named, never an error.
"""

from __future__ import annotations

import ast
import json
import operator
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from roofline.errors import RooflineError
from roofline.launch.base import (
    Default,
    LaunchConfig,
    LaunchError,
    LaunchKind,
    LaunchWorkload,
    Problem,
    Unsupported,
    closest_hint,
)

DEFAULTS_DIR = Path(__file__).parent / "defaults"
# shell words that end the engine's command (the next command, a pipe, a redirection)
_COMMAND_END = frozenset({"&&", "||", ";", "|", "&", ">", ">>", "<", ">&", "<&", "&>", ">|", "|&"})
_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_NUMBER = re.compile(r"^-\d+(\.\d+)?$")
# No degree, limit or length a server is launched with is past 2^30 (serve's own bound on every
# size: beyond it nothing served is physical); a larger number is a typo.
MAX_COUNT = 2**30


@dataclass(frozen=True)
class EngineTable:
    """One engine's defaults table (launch/defaults/<engine>.toml), flattened."""

    name: str
    display: str
    release: str
    entry: tuple[str, ...]  # how its command starts ('vllm serve', 'sglang.launch_server')
    value_flags: frozenset[str]
    switch_flags: frozenset[str]
    negatable: frozenset[str]
    aliases: Mapping[str, str]  # alias -> canonical flag
    inert: frozenset[str]
    prefer: tuple[str, ...]  # what an abbreviation later releases made ambiguous meant before
    underscores: bool  # `--a_b` is `--a-b`
    abbreviations: bool  # an unambiguous prefix of a long flag is that flag
    enable_disable: bool  # `--disable-x` negates `--enable-x` (and back)
    positionals: int  # positional arguments the command takes (the model)
    defaults: Mapping[str, tuple[Any, str]]  # key -> (value, source)
    quantization: Mapping[str, tuple[str, str]]  # method -> (weights, compute)
    kv_cache_dtype: Mapping[str, str]  # value -> dtype ('' = auto)
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def known(self) -> frozenset[str]:
        return self.value_flags | self.switch_flags | frozenset(self.aliases)

    def default(self, key: str) -> Default:
        value, source = self.defaults[key]
        return Default(key, value, source)


@cache
def load_table(name: str) -> EngineTable:
    """The defaults table of engine `name` (vllm, sglang, trtllm)."""
    raw = tomllib.loads((DEFAULTS_DIR / f"{name}.toml").read_text())
    flags, legacy = raw.get("flags", {}), raw.get("legacy", {})
    return EngineTable(
        name=raw["name"],
        display=raw["display"],
        release=raw["release"],
        entry=tuple(raw["entry"]),
        value_flags=frozenset(flags.get("value", ())) | frozenset(legacy.get("value", ())),
        switch_flags=frozenset(flags.get("switch", ())) | frozenset(legacy.get("switch", ())),
        negatable=frozenset(flags.get("negatable", ())),
        aliases=dict(flags.get("aliases", {})),
        inert=frozenset(raw.get("inert", {}).get("flags", ())),
        prefer=tuple(flags.get("prefer", ())),
        underscores=bool(raw.get("underscores")),
        abbreviations=bool(raw.get("abbreviations")),
        enable_disable=bool(raw.get("enable_disable")),
        positionals=int(raw.get("positionals", 0)),
        defaults={k: (v["value"], v["source"]) for k, v in raw.get("defaults", {}).items()},
        quantization={k: (v[0], v[1]) for k, v in raw.get("quantization", {}).items()},
        kv_cache_dtype=dict(raw.get("kv_cache_dtype", {})),
        raw=raw,
    )


# ------------------------------------------------------------------------------ the command line


_HEREDOC = re.compile(
    r"^[^\n]*?<<-?\s*(['\"]?)(\w+)\1[^\n]*\n(.*?)^\s*\2\s*$",
    re.M | re.S,
)
_TARGET = re.compile(r">\s*([^\s<>;&|]+)")


def heredocs(text: str) -> tuple[str, dict[str, str]]:
    """(the script without its here-documents, file name -> body of each `cat > F <<EOF`)."""
    files: dict[str, str] = {}
    env = _Env()
    for line in text.splitlines():
        env.line(line)

    def cut(m: re.Match[str]) -> str:
        first = m.group(0).split("\n", 1)[0]
        target = _TARGET.search(first.replace("<<", "  "))
        if target:
            files[Path(_expand(target.group(1).strip("\"'"), env.values)).name] = m.group(3)
        return "\n"

    return _HEREDOC.sub(cut, text), files


def _logical_lines(text: str) -> list[str]:
    """The script's lines with backslash continuations joined."""
    return re.sub(r"\\\r?\n", " ", text).splitlines()


_SUBST = re.compile(r"\$\(\(([^()]*)\)\)|\$\(([^()]*)\)|`([^`]*)`")


def _opaque(m: re.Match[str]) -> str:
    """A command substitution kept as one word (it runs at launch); an arithmetic expansion
    kept whole for `_expand` to evaluate."""
    if m.group(1) is not None:
        return "'$((" + m.group(1) + "))'"
    body = m.group(2) if m.group(2) is not None else m.group(3)
    return "'$(" + re.sub(r"['\"]", "", body) + ")'"


_ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _arith(expr: str, env: Mapping[str, str]) -> str | None:
    """`$((dp * 512))` with the script's integer variables: + - * / of whole numbers (as bash)."""
    text = re.sub(r"\$?\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), "x"), expr)
    try:
        tree = ast.parse(text.replace("/", "//"), mode="eval").body
    except SyntaxError:
        return None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            return _ARITH_OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            return int(ev(node.left) / ev(node.right))
        raise ValueError(node)

    try:
        return str(ev(tree))
    except (ValueError, ZeroDivisionError):
        return None


def _words(line: str) -> list[str]:
    line = _SUBST.sub(_opaque, line)
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        return list(lex)
    except ValueError as e:  # an unclosed quote
        raise LaunchError(
            f"cannot split the line {line.strip()[:80]!r} into words: {e}",
            rule="a launch line is a shell command (quotes closed, `\\` to continue a line)",
            fix="close the quote",
        ) from None


def _expand(word: str, env: Mapping[str, str]) -> str:
    """$NAME, ${NAME} and $((arithmetic)) from the script's own `NAME=value` lines (what
    reading cannot know is kept as written)."""
    word = re.sub(r"\$\(\(([^()]*)\)\)", lambda m: _arith(m.group(1), env) or m.group(0), word)

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return env.get(name, m.group(0))

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, word)


def _entry_at(words: Sequence[str], entry: str) -> int | None:
    """Index just past the entry point `entry` ('vllm serve', 'sglang.launch_server') in words;
    'image:NAME' is a container image whose entry point is the server (`docker run ... IMAGE`)."""
    if entry.startswith("image:"):
        image = re.compile(r"(\S+/)?" + re.escape(entry[6:]) + r"(:\S+)?")
        return next((i + 1 for i, w in enumerate(words) if image.fullmatch(w)), None)
    parts = entry.split()
    for i in range(len(words) - len(parts) + 1):
        window = [Path(w).name if j == 0 else w for j, w in enumerate(words[i : i + len(parts)])]
        if window == parts:
            return i + len(parts)
    return None


_QUOTED = re.compile(r"^(['\"])(.*)\1$", re.S)
_RUNTIME = re.compile(r"\$[0-9@*#?]|\$\((?!\()|`")  # known only when the script runs
_OPEN = re.compile(r"^(if|case|for|while|until)\b")
_CLOSE = re.compile(r"^(fi|esac|done)\b")


@dataclass
class _Env:
    """The script's variables as far as reading can know them: `NAME=value` lines in order.
    An assignment inside an if / case / loop block counts only when none outside one exists
    (reading cannot tell which branch runs); every value set is kept for the problem report."""

    values: dict[str, str] = field(default_factory=dict)
    seen: dict[str, list[str]] = field(default_factory=dict)
    plain: set[str] = field(default_factory=set)  # names set outside any block
    depth: int = 0

    def line(self, line: str) -> bool:
        """Take one logical line: True when it is an assignment (or block keyword) only."""
        text = line.strip()
        if _CLOSE.match(text):
            self.depth = max(self.depth - 1, 0)
        opens = bool(_OPEN.match(text)) and not re.search(r"\b(fi|esac|done)\s*$", text)
        assigned = self._assign(text)
        self.depth += opens
        return assigned

    def _assign(self, text: str) -> bool:
        m = _ASSIGN.match(text)
        if not m:
            return False
        raw = m.group(2).strip()
        q = _QUOTED.match(raw)
        if q is None and re.search(r"\s", raw):
            return False  # `NAME=x cmd ...` sets NAME for that command only
        if _RUNTIME.search(raw):
            return True  # `$1`, `$(cmd)`: known only when the script runs
        name, value = m.group(1), _expand(q.group(2) if q else raw, self.values)
        self.seen.setdefault(name, []).append(value)
        if self.depth == 0 or name not in self.plain:
            self.values[name] = value
        if self.depth == 0:
            self.plain.add(name)
        return True


def _expand_word(word: str, env: Mapping[str, str]) -> list[str]:
    """One word after expansion: an unquoted `$ARGS` holding several words splits into them."""
    value = _expand(word, env)
    if value != word and re.fullmatch(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", word):
        return _words(value)
    return [value] if value else []


def command_words(text: str, table: EngineTable, source: str) -> tuple[list[str], list[Problem]]:
    """The words after the engine's entry point in the first line that runs it, with the
    script's `NAME=value` variables expanded (see `_Env`; a variable the line uses that the
    script sets to different values is named as a problem), or a LaunchError when no line
    runs it."""
    env = _Env()
    for line in _logical_lines(heredocs(text)[0]):
        if env.line(line):
            continue
        raw = _words(line) if line.strip() else []
        for entry in table.entry:
            at = _entry_at(raw, entry)
            if at is None:
                continue
            rest = raw[at:]
            end = next((i for i, w in enumerate(rest) if _ends(rest, i)), len(rest))
            words = [x for w in rest[:end] for x in _expand_word(w, env.values)]
            return words, _reassigned(rest[:end], env)
    raise LaunchError(
        f"{source}: no line runs {table.display} (looked for {' or '.join(table.entry)})",
        rule=f"a {table.display} launch file is the shell command that starts its server",
        fix=f"give the file with the `{table.entry[0]} ...` line, or name its stack with --stack",
    )


def _ends(words: Sequence[str], i: int) -> bool:
    """Whether words[i] ends the command: an operator, or the fd number of a redirection."""
    if words[i] in _COMMAND_END:
        return True
    nxt = words[i + 1] if i + 1 < len(words) else ""
    return words[i].isdigit() and nxt[:1] in (">", "<")


def _reassigned(words: Sequence[str], env: _Env) -> list[Problem]:
    """A problem for each variable the command uses that the script sets to different values."""
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", " ".join(words)))
    out = []
    for name, vals in env.seen.items():
        if name in used and len(set(vals)) > 1:
            distinct = list(dict.fromkeys(vals))
            shown = (
                "to " + ", ".join(map(repr, distinct))
                if sum(map(len, distinct)) <= 120
                else f"{len(distinct)} different ways"
            )
            which = "the value set outside any branch" if name in env.plain else "the last"
            out.append(
                Problem(
                    f"${name}",
                    f"the script sets {name} {shown} (in branches reading cannot choose "
                    f"between); read as {which}"
                    + (f", {env.values[name]!r}" if len(env.values[name]) <= 60 else ""),
                )
            )
    return out


# ------------------------------------------------------------------------------ argparse's rules


@dataclass
class Args:
    """A command line read by the engine's flag rules: positionals, and canonical flag -> value
    (True/False for switches, a string, a list for several words, a dict for `--x.key v`)."""

    positionals: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


def _spelling(name: str, table: EngineTable) -> str:
    if table.underscores and name.startswith("--"):
        head, dot, tail = name[2:].partition(".")
        return "--" + head.replace("_", "-") + dot + tail
    return name


def _negated(name: str, table: EngineTable) -> str | None:
    """The flag `name` switches off (`--no-x`; `--disable-x` for `--enable-x`), or None."""
    if name.startswith("--no-") and "--" + name[5:] in table.negatable:
        return "--" + name[5:]
    if table.enable_disable:
        for a, b in (("--disable-", "--enable-"), ("--enable-", "--disable-")):
            if name.startswith(a) and b + name[len(a) :] in table.negatable:
                return b + name[len(a) :]
    return None


def _abbreviation(name: str, table: EngineTable, source: str) -> tuple[str, ...]:
    """The flags `name` abbreviates (argparse allow_abbrev): one, several of one kind (a
    published line that ran under a release with fewer flags), or a LaunchError when they
    differ in kind (switch and value), which no parse can settle."""
    if not (table.abbreviations and name.startswith("--")):
        return ()
    hits = tuple(sorted({table.aliases.get(k, k) for k in table.known if k.startswith(name)}))
    kinds = {h in table.switch_flags for h in hits}
    if len(kinds) > 1:
        raise LaunchError(
            f"{source}: {name} is ambiguous in {table.display}: it abbreviates {', '.join(hits[:6])}",
            rule=f"{table.display} reads a flag prefix only when one flag starts with it (argparse)",
            fix=f"write the whole flag, e.g. {hits[0]}",
        )
    return hits


def resolve_flag(
    written: str, table: EngineTable, source: str
) -> tuple[str, bool | None, tuple[str, ...]]:
    """(canonical flag, False when the spelling negates a switch else None, the flags an
    ambiguous abbreviation could mean) or a LaunchError naming the closest known flag. An
    ambiguous abbreviation comes back as written, with its candidates."""
    name = _spelling(written, table)
    if name in table.known:
        return table.aliases.get(name, name), None, ()
    off = _negated(name, table)
    if off is not None:
        return off, False, ()
    hits = _abbreviation(name, table, source)
    if len(hits) == 1:
        return hits[0], None, ()
    meant = [h for h in hits if h in table.prefer]
    if len(meant) == 1:
        return meant[0], None, hits
    if hits:
        return name, None, hits
    raise LaunchError(
        f"{source}: unknown {table.display} flag {written}{closest_hint(name, sorted(table.known))}",
        rule=f"flags are those {table.release} takes (launch/defaults/{table.name}.toml)",
        fix="correct the flag, or drop it",
    )


def _is_flag(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not _NUMBER.match(word)


def _dotted(args: Args, flag: str, keys: list[str], value: Any) -> None:
    """`--speculative-config.num_speculative_tokens 3` sets one key of a JSON flag."""
    node = args.options.setdefault(flag, {})
    if not isinstance(node, dict):
        node = args.options[flag] = {}
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def parse_args(words: Sequence[str], table: EngineTable, source: str) -> Args:
    """Read `words` as the engine's parser does (see the table's rules): a word that is no
    flag's value is the engine's positional argument (the model) while it takes one, else it
    joins the value before it (list flags take several)."""
    args, i, last = Args(), 0, None
    while i < len(words):
        word = words[i]
        i += 1
        if not _is_flag(word):
            if last is not None and len(args.positionals) >= table.positionals:
                prev = args.options[last]
                args.options[last] = [*(prev if isinstance(prev, list) else [prev]), word]
            else:
                args.positionals.append(word)
            continue
        head, eq, value = word.partition("=")
        base, dot, sub = head.partition(".") if head.startswith("--") else (head, "", "")
        flag, negate, could = resolve_flag(base, table, source)
        last = None
        if could:
            read_as = f"read as {flag}" if flag != base else "read as written"
            args.problems.append(
                Problem(
                    base,
                    f"abbreviates {', '.join(could)} (the release it ran under had one): {read_as}",
                )
            )
        if (could[0] if could else flag) in table.switch_flags and not dot:
            if eq:
                raise LaunchError(
                    f"{source}: {base} is a switch and takes no value (got {word!r})",
                    rule=f"{table.display} switches are on when written, off when left out",
                    fix=f"write {base} alone",
                )
            args.options[flag] = negate is None
            continue
        if not eq:
            if i >= len(words) or _is_flag(words[i]):
                raise LaunchError(
                    f"{source}: {base} needs a value and none follows",
                    rule=f"{table.display}'s {flag} takes one argument",
                    fix=f"write {flag} VALUE",
                )
            value, i = words[i], i + 1
        if dot:
            _dotted(args, flag, sub.split("."), value)  # keys after the dot as written
        else:
            args.options[flag], last = value, flag
    return args


# ------------------------------------------------------------------------------ companion files


def companion_file(text: str, source: str, name: str) -> str | None:
    """The text of a file a launch line names (`--config FILE`, `--extra_llm_api_options FILE`):
    the script's here-document that writes it, else the file beside the script, else None."""
    body = heredocs(text)[1].get(Path(str(name)).name)
    if body is None and source != "<text>":
        beside = Path(source).parent / str(name)
        if beside.is_file():
            body = beside.read_text()
    return body


def _config_word(key: str, value: Any, table: EngineTable) -> list[str]:
    """One `key: value` of a --config YAML as the command-line words it stands for."""
    flag = _spelling("--" + str(key), table)
    if value is True:
        return [flag]
    if value is False or value is None:  # a switch left off; negatable ones say so
        return ["--no-" + flag[2:]] if value is False and flag in table.negatable else []
    if isinstance(value, list):
        return [flag, *map(str, value)]
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def config_file_args(text: str, args: Args, table: EngineTable, source: str) -> Args:
    """`--config FILE` (vLLM, SGLang: a YAML of flag: value) merged under the command line,
    whose flags win (vllm/utils/argparse_utils.py _pull_args_from_config; SGLang's
    ConfigArgumentMerger). A file reading cannot find is named as a problem."""
    name = args.options.pop("--config", None)
    if name is None:
        return args
    body = companion_file(text, source, str(name))
    doc = yaml.safe_load(body) if body is not None else None
    if not isinstance(doc, dict):
        why = "is not in the script" if body is None else "is not a YAML mapping"
        args.problems.append(Problem("--config", f"{name} {why}: its settings are not read"))
        return args
    words: list[str] = []
    model = doc.pop("model", None) if table.positionals else None
    for key, value in doc.items():
        words += _config_word(key, value, table)
    from_file = parse_args(words, table, f"{source} --config {name}")
    positionals = args.positionals or ([str(model)] if model else [])
    return Args(
        positionals=positionals,
        options={**from_file.options, **args.options},
        problems=args.problems + from_file.problems,
    )


# ------------------------------------------------------------------------------ values


def human_int(text: Any) -> int:
    """'8192', '32k' (x1000), '32K' (x1024), '1.5k' -> int; ValueError otherwise (the engines'
    human_readable_int: vllm/engine/arg_utils.py at v0.33.0)."""
    s = str(text).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG])", s)
    if not m:
        return int(s)
    num, suffix = m.groups()
    if suffix in "kmg":
        return int(float(num) * {"k": 10**3, "m": 10**6, "g": 10**9}[suffix])
    return int(num) * {"K": 2**10, "M": 2**20, "G": 2**30}[suffix]


# a quantized checkpoint's name is its base model's with the format appended; a dated
# re-release (DeepSeek-R1-0528, DeepSeek-V3-0324) keeps its architecture
_QUANT_SUFFIX = re.compile(
    r"([-_](fp8|fp4|nvfp4|mxfp4|awq|gptq|int4|int8|w8a8|w4a16|dynamic|block|v\d|\d{4}))+$",
    re.I,
)


def model_spec(ref: str | None) -> Any:
    """The catalog's (or a local config.json's) model for `ref` (or for the base model of a
    quantized checkpoint's name, 'nvidia/DeepSeek-R1-FP4' -> DeepSeek-R1), else None."""
    if not ref:
        return None
    from roofline.specs.model_catalog import load_model

    for name in dict.fromkeys((str(ref), _QUANT_SUFFIX.sub("", str(ref).rstrip("/")))):
        try:
            return load_model(name)
        except (RooflineError, OSError, ValueError):
            continue
    return None


def is_moe(ref: str | None) -> bool | None:
    """Whether the model `ref` names has experts (None: the catalog does not know it)."""
    spec = model_spec(ref)
    return None if spec is None else spec.moe is not None


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's own dtypes (launch/defaults/checkpoints.toml); kv '' = the engine's rule."""

    weights: str
    compute: str
    kv: str
    source: str


@cache
def _checkpoint_rules() -> tuple[tuple[str, Checkpoint], ...]:
    raw = tomllib.loads((DEFAULTS_DIR / "checkpoints.toml").read_text())
    rows = [*raw.get("native", ()), *raw.get("name", ())]
    return tuple(
        (r["pattern"], Checkpoint(r["weights"], r["compute"], r.get("kv", ""), r["source"]))
        for r in rows
    )


def checkpoint_quant(ref: str | None) -> Checkpoint | None:
    """The dtypes of a checkpoint that is not bf16, from launch/defaults/checkpoints.toml; None
    for a bf16 checkpoint (or one whose format its name does not say)."""
    tail = str(ref or "").strip().rstrip("/")
    for pattern, found in _checkpoint_rules():
        if re.search(pattern, tail, re.IGNORECASE):
            return found
    return None


def default_kv(stack: str, model: str | None) -> str:
    """The KV dtype an engine runs when the launch line leaves it to the engine ('auto'): what
    the checkpoint declares, else the engine's rule for a checkpoint of its weights (a ModelOpt
    FP8/NVFP4 checkpoint runs an FP8 cache). Quantizing at load (`--quantization fp8` on a bf16
    checkpoint) leaves the cache in the model's dtype: the rule follows the checkpoint."""
    own = checkpoint_quant(model)
    if own is not None and own.kv:
        return own.kv
    from roofline.specs.engines import load_engine

    return load_engine(stack).kv_dtype_for(own.weights if own else "bf16")


# ------------------------------------------------------------------------------ the reading


@dataclass
class Reading:
    """What one serving reader gathers: the replica's degrees, limits and dtypes in the
    project's vocabulary, and every default, unexpressed setting and problem on the way."""

    table: EngineTable
    source: str
    options: dict[str, Any] = field(default_factory=dict)  # canonical key -> value as written
    used: set[str] = field(default_factory=set)
    model: str | None = None
    tp: int = 1
    pp: int = 1
    dp: int = 1  # attention data parallel inside the replica
    ep: int = 1
    replicas: int = 1
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_batched_tokens: int | None = None
    weights: str | None = None
    compute: str | None = None
    kv: str | None = None
    draft: int | None = None
    defaults: list[Default] = field(default_factory=list)
    unsupported: list[Unsupported] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def take(self, *keys: str) -> Any:
        """The first of `keys` the file sets (marked as read), or None; a LaunchError when it
        gives several values (`--tp 8 4`, a YAML list) where the engine takes one."""
        for k in keys:
            if k in self.options:
                self.used.add(k)
                v = self.options[k]
                if isinstance(v, list):
                    raise LaunchError(
                        f"{self.source}: {k} is given {len(v)} values ({' '.join(map(str, v))[:60]})",
                        rule=f"{self.table.display}'s {k} takes one value",
                        fix=f"give {k} one value",
                    )
                return v
        return None

    def fill(self, key: str) -> Any:
        """The table's default for `key`, recorded as filled."""
        d = self.table.default(key)
        self.defaults.append(d)
        return d.value

    def integer(self, key: str, value: Any, *, lo: int = 1, human: bool = False) -> int:
        """`value` of `key` as a whole number >= lo, or a LaunchError naming the rule."""
        try:
            n = human_int(value) if human else int(str(value).strip())
        except ValueError:
            n = None
        if n is None or n < lo or n > MAX_COUNT:
            raise LaunchError(
                f"{self.source}: {key} {value!r}",
                rule=f"{self.table.display}'s {key} is a whole number from {lo} to 2^30"
                + (" (32k = 32000, 32K = 32768)" if human else ""),
                fix=f"write e.g. {key} {max(lo, 8)}",
            )
        return n

    def degree(self, key: str, *flags: str) -> int:
        """A parallel degree: the first of `flags` the file sets, else the table's default for
        `key` (recorded)."""
        v = self.take(*flags)
        return self.fill(key) if v is None else self.integer(flags[0], v)

    def choice(self, flag: str, value: Any, table: Mapping[str, Any]) -> Any:
        """`value` of `flag` looked up in `table`, or a LaunchError naming the closest."""
        key = str(value).strip()
        if key in table:
            return table[key]
        raise LaunchError(
            f"{self.source}: {flag} {key!r}{closest_hint(key, sorted(table))}",
            rule=f"{self.table.display}'s {flag} is one of " + ", ".join(sorted(table)),
            fix=f"write one of those after {flag}",
        )

    def quantization(self, flag: str, method: Any) -> None:
        """Weights and compute dtype from the engine's --quantization (or the checkpoint)."""
        if method is None:
            self._checkpoint_quant()
            return
        pair = self.table.quantization.get(str(method))
        if pair is None:
            self.unsupported.append(
                Unsupported(flag, method, "a method the project has no dtype for: costed at bf16")
            )
            return
        self.weights, self.compute = pair

    def _checkpoint_quant(self) -> None:
        self.defaults.append(self.table.default("quantization"))
        found = checkpoint_quant(self.model)
        if found is not None:
            self.weights, self.compute = found.weights, found.compute
            self.defaults.append(Default("weights", found.weights, found.source))

    def kv_dtype(self, flag: str, value: Any) -> None:
        """The KV dtype from the engine's KV-cache flag ('auto' and None: the engine's rule)."""
        if value is None:
            self.fill("kv_cache_dtype")
            return
        self.kv = self.choice(flag, value, self.table.kv_cache_dtype) or None

    def check_moe_split(self, key: str) -> None:
        """A problem when the experts' split does not divide the GPUs that run attention."""
        if (self.tp * self.dp) % self.ep:
            self.problems.append(
                Problem(
                    key,
                    f"the experts are split {self.ep} ways over tp x dp = {self.tp * self.dp} "
                    "GPUs, which it does not divide",
                )
            )

    def rest_unsupported(self) -> None:
        """Every flag the reader did not map, named (never dropped)."""
        for key, value in self.options.items():
            if key in self.used:
                continue
            reason = (
                "front-end, logging, tokenizer or kernel-selection setting: not a cost input"
                if key in self.table.inert
                else "serve has no flag for it: engine_profile(config) puts it in the engine's profile"
                if key in self.table.raw.get("engine", {})
                else f"a {self.table.display} setting `serve --plan` has no input for"
            )
            self.unsupported.append(Unsupported(key, value, reason))


def _devices(r: Reading, chips: int | None) -> int:
    """The GPUs the config runs on: the file's (server GPUs x replicas), or the devices the
    caller gives when they hold whole servers (more copies of the server: named as a filled
    default); devices that do not hold whole servers are a problem."""
    server = r.tp * r.pp * r.dp
    own = server * r.replicas
    if chips is None or chips == own:
        return own
    if chips % server:
        r.problems.append(
            Problem(
                "chips",
                f"{chips} devices were given but the launch line's server takes {server} GPUs "
                f"({own} with its {r.replicas} replica(s)): {chips} does not hold whole servers",
            )
        )
        return own
    r.defaults.append(
        Default(
            "replicas",
            chips // server,
            f"the {chips} devices given over the server's {server} GPUs (the file runs {own})",
        )
    )
    return chips


def read_command_line(text: str, stack: str, source: str) -> tuple[Reading, list[str]]:
    """The engine's command line in `text` (with any --config file it names) read against its
    flag table: the Reading and the positional words (the model, where the engine takes it so)."""
    table = load_table(stack)
    words, notes = command_words(text, table, source)
    args = config_file_args(text, parse_args(words, table, source), table, source)
    r = Reading(table, source, options=dict(args.options), problems=notes + args.problems)
    return r, list(args.positionals)


def serving_config(r: Reading, stack: str, *, chips: int | None = None) -> LaunchConfig:
    """The LaunchConfig of a finished Reading (plan, workload, options, notes)."""
    weights = r.weights or "bf16"
    kv = r.kv or default_kv(stack, r.model)
    plan = {"tp": str(r.tp)}
    plan.update({k: str(v) for k, v in (("pp", r.pp), ("dp", r.dp), ("ep", r.ep)) if v > 1})
    options = {
        "engine": stack,
        "weight_dtype": weights,
        "kv_dtype": kv,
        "compute_dtype": r.compute or "bf16",
    }
    if r.draft:
        options["draft"] = str(r.draft)
    file_chips = _devices(r, chips)
    r.rest_unsupported()
    return LaunchConfig(
        stack=stack,
        kind=LaunchKind.SERVING,
        source=r.source,
        model=r.model,
        serve_plan=plan,
        workload=LaunchWorkload(
            max_model_len=r.max_model_len,
            max_num_seqs=r.max_num_seqs,
            max_batched_tokens=r.max_batched_tokens,
        ),
        chips=file_chips,
        options=options,
        settings=dict(r.options),
        defaults=tuple(r.defaults),
        unsupported=tuple(r.unsupported),
        problems=tuple(r.problems),
    )


# ------------------------------------------------------------------------------ the engine profile


def _setting(settings: Mapping[str, Any], key: str) -> Any:
    """A setting as read, `section.key` looking inside a YAML section."""
    if key in settings:
        return settings[key]
    head, dot, rest = key.partition(".")
    section = settings.get(head) if dot else None
    return section.get(rest) if isinstance(section, dict) else None


def _field_value(config: LaunchConfig, key: str, value: Any, how: str) -> Any:
    if how == "fraction":
        try:
            v = float(value)
        except (TypeError, ValueError):
            v = -1.0
        if not 0 < v <= 1:
            raise LaunchError(
                f"{config.source}: {key} {value!r}",
                rule=f"{key} is a fraction of the GPU's memory, in (0, 1]",
                fix=f"write e.g. {key} 0.9",
            )
        return v
    on = value is True or str(value).strip().lower() in ("true", "1", "yes")
    return 0.0 if how == "zero" else on


def engine_profile(config: LaunchConfig) -> Any:
    """The engine's profile (specs/engines/<stack>.toml) with what the launch file sets in
    place of its defaults: sequences in flight (the replica's: per rank x attention-DP ranks),
    tokens per step, and the settings the table's [engine] maps (memory fraction, chunked
    prefill, ...). What the file leaves out keeps the profile's value and its source."""
    from dataclasses import replace

    from roofline.specs.engines import load_engine

    table = load_table(config.stack)
    changes: dict[str, Any] = {}
    w, dp = config.workload, int(config.serve_plan.get("dp", 1))
    if w.max_num_seqs:
        # the replica's total, so the profile's seq_cap must not multiply it by dp again
        changes["max_num_seqs"] = w.max_num_seqs * dp
        changes["max_num_seqs_per_dp_rank"] = False
    if w.max_batched_tokens:
        changes["max_num_batched_tokens"] = w.max_batched_tokens
        changes["max_num_batched_tokens_large_hbm"] = None
    for key, (name, how) in table.raw.get("engine", {}).items():
        value = _setting(config.settings, key)
        if value is not None and not (how == "zero" and value is False):
            changes[name] = _field_value(config, key, value, how)
    return replace(load_engine(config.stack), **changes)


# ------------------------------------------------------------------------------ to and from serve


def _plan_dict(stack: str, plan: Mapping[str, Any]) -> dict[str, str]:
    """tp/pp/dp/ep of a serving plan's `to_dict()` (serving.inference.ServePlan); a KV layout
    other than the engines' own (heads) is a LaunchError."""
    layout = str(plan.get("kv_layout", "heads"))
    if layout != "heads":
        raise LaunchError(
            f"cannot write a {stack} launch line for the KV layout {layout!r}",
            rule="the engines shard the KV cache by heads over their tensor-parallel GPUs; "
            "the book's heads-then-batch layout is not a launch flag",
            fix="export the plan with kv=heads (the default)",
        )
    out = {k: str(plan[k]) for k in ("tp", "pp", "dp", "ep") if k in plan}
    out.setdefault("tp", "1")
    return {k: v for k, v in out.items() if k == "tp" or v != "1"}


def from_serve(
    stack: str,
    *,
    model: str,
    plan: Mapping[str, Any],
    chips: int | None = None,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
    compute_dtype: str | None = None,
    draft: int | None = None,
    workload: LaunchWorkload | None = None,
) -> LaunchConfig:
    """The serving LaunchConfig of `serve`'s inputs (what `export --to vllm|sglang|trtllm`
    writes): the model as the engine will load it, the plan (`parse_serve_plan(...).to_dict()`),
    the GPUs in all (whole replicas of the plan) and the dtypes (left out: the checkpoint's
    own, and the engine's KV rule for it)."""
    own = checkpoint_quant(model)
    weights = weight_dtype or (own.weights if own else "bf16")
    compute = compute_dtype or (own.compute if own and own.weights == weights else "bf16")
    options = {
        "engine": stack,
        "weight_dtype": weights,
        "kv_dtype": kv_dtype or default_kv(stack, model),
        "compute_dtype": compute,
    }
    if draft:
        options["draft"] = str(draft)
    return LaunchConfig(
        stack=stack,
        kind=LaunchKind.SERVING,
        source="roofline export",
        model=model,
        serve_plan=_plan_dict(stack, plan),
        chips=chips,
        options=options,
        workload=workload or LaunchWorkload(),
    )


def serve_argv(config: LaunchConfig) -> list[str]:
    """The `roofline serve` arguments that cost a serving LaunchConfig exactly as read: the
    model (the catalog's name for it where the catalog knows it), the plan, the dtypes and the
    engine (the caller adds --system and the load, or
    --batch / --context, with --draft from options['draft'] for one decode step)."""
    if config.kind != LaunchKind.SERVING:
        raise LaunchError(
            f"{config.source} is a {config.kind.value} launch",
            rule="serve costs serving launch files",
            fix="cost it with roofline import (train's one-plan path)",
        )
    o = config.options
    spec = model_spec(config.model)
    model = spec.name if spec is not None else str(config.model)
    argv = ["--model", model, "--plan", config.serve_plan_text]
    argv += ["--weight-dtype", o["weight_dtype"], "--kv-dtype", o["kv_dtype"]]
    return argv + ["--compute-dtype", o["compute_dtype"], "--engine", o["engine"]]


# ------------------------------------------------------------------------------ writing


@dataclass(frozen=True)
class ServingPlan:
    """A serving LaunchConfig's plan as numbers, for the writers."""

    model: str
    tp: int
    pp: int
    dp: int
    ep: int
    replicas: int
    weights: str
    kv: str
    compute: str
    draft: int | None


def _int_of(config: LaunchConfig, key: str, text: Any) -> int:
    try:
        n = int(str(text))
    except ValueError:
        n = 0
    if n < 1:
        raise LaunchError(
            f"the {config.stack} export: {key}={text!r}",
            rule="degrees, replicas and draft lengths are whole numbers >= 1",
            fix=f"give {key} as a positive whole number",
        )
    return n


def serving_plan(config: LaunchConfig, stack: str) -> ServingPlan:
    """The numbers a writer needs, or a LaunchError naming what is missing."""
    if config.kind != LaunchKind.SERVING or not config.model:
        what = "a serving plan" if config.kind != LaunchKind.SERVING else "a model"
        raise LaunchError(
            f"cannot write a {stack} launch line: the plan has no {what.split()[-1]}",
            rule=f"a {stack} launch line serves one model with a serving plan (tp, pp, dp, ep)",
            fix="export with serve's inputs: --model NAME --plan tp=8",
        )
    deg = {k: _int_of(config, k, config.serve_plan.get(k, 1)) for k in ("tp", "pp", "dp", "ep")}
    per = deg["tp"] * deg["pp"] * deg["dp"]
    chips = config.chips or per
    if chips % per:
        raise LaunchError(
            f"cannot write a {stack} launch line: {chips} GPUs do not hold whole servers of {per}",
            rule="the GPUs run a whole number of replicas of the plan (tp x pp x dp GPUs each)",
            fix=f"use a multiple of {per} GPUs",
        )
    opt = config.options
    draft = opt.get("draft")
    return ServingPlan(
        model=config.model,
        replicas=chips // per,
        weights=str(opt.get("weight_dtype") or "bf16"),
        kv=str(opt.get("kv_dtype") or "bf16"),
        compute=str(opt.get("compute_dtype") or "bf16"),
        draft=_int_of(config, "draft", draft) if draft not in (None, "", "0") else None,
        **deg,
    )


def quant_method(p: ServingPlan, table: EngineTable, stack: str) -> str | None:
    """The engine's --quantization for the plan's dtypes (None: bf16 or the checkpoint's own)."""
    if p.weights == "bf16" and p.compute == "bf16":
        return None
    own = checkpoint_quant(p.model)
    if own is not None and (own.weights, own.compute) == (p.weights, p.compute):
        return None
    for method, pair in table.quantization.items():
        if pair == (p.weights, p.compute):
            return method
    raise LaunchError(
        f"cannot write a {stack} launch line: it has no quantization method for "
        f"{p.weights} weights with {p.compute} compute",
        rule=f"{table.display}'s methods give (weights/compute): "
        + ", ".join(sorted({f"{w}/{c}" for w, c in table.quantization.values()}))
        + f" (launch/defaults/{table.name}.toml)",
        fix="choose a weight/compute dtype pair the engine serves, or a checkpoint in that format",
    )


def kv_value(p: ServingPlan, table: EngineTable, stack: str) -> str | None:
    """The engine's KV-cache dtype value for the plan (None when its default gives it)."""
    if p.kv == default_kv(stack, p.model):
        return None
    for value, dtype in table.kv_cache_dtype.items():
        if dtype == p.kv:
            return value
    raise LaunchError(
        f"cannot write a {stack} launch line: it has no KV-cache dtype {p.kv}",
        rule=f"{table.display}'s KV-cache dtypes: "
        + ", ".join(sorted(v for v in table.kv_cache_dtype if v != "auto")),
        fix="choose one of those",
    )


_REPLICAS = re.compile(r"^\s*#\s*roofline export:\s*(\d+) replicas of this server", re.M)


def replicas_comment(n: int, gpus: int) -> str:
    """The header an export writes when the plan runs several copies of one server."""
    return (
        f"# roofline export: {n} replicas of this server ({gpus} GPUs in all): "
        "run this command on each group of GPUs, behind one load balancer\n"
    )


def replicas_in(text: str) -> int | None:
    """The replica count of an export's header, or None."""
    m = _REPLICAS.search(text)
    return int(m.group(1)) if m else None


def shell_line(words: Sequence[str]) -> str:
    """One command, a flag (with its value) per continued line."""
    head, rest = [], list(words)
    while rest and not rest[0].startswith("--"):
        head.append(shlex.quote(rest.pop(0)))
    lines, cur = [" ".join(head)], []
    for w in rest:
        if w.startswith("-") and cur:
            lines.append(" ".join(cur))
            cur = []
        cur.append(shlex.quote(w))
    if cur:
        lines.append(" ".join(cur))
    return " \\\n  ".join(lines) + "\n"


__all__ = [
    "Args",
    "EngineTable",
    "Reading",
    "ServingPlan",
    "Checkpoint",
    "checkpoint_quant",
    "default_kv",
    "engine_profile",
    "command_words",
    "companion_file",
    "config_file_args",
    "heredocs",
    "human_int",
    "is_moe",
    "kv_value",
    "load_table",
    "model_spec",
    "parse_args",
    "quant_method",
    "replicas_comment",
    "replicas_in",
    "from_serve",
    "resolve_flag",
    "serve_argv",
    "serving_config",
    "serving_plan",
    "shell_line",
]
