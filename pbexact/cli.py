"""What every command-line tool shares: the parser whose usage errors are one line, the argparse
``type=`` functions, and :func:`run_main`, which maps how a tool ends to its exit code (the
torch tools' device and threads: :mod:`pbscale.runs.runtime`).

A bad value given to one of these types becomes argparse's one-line
``error: argument --x: ...; see PROG --help`` and exit code 2, like a
:class:`~pbexact.errors.PBInputError` raised later by the tool. Every integer type refuses values
past a signed 64-bit integer (:data:`MAX_INT`, what torch and numpy take as a seed or a size) and
every number type values past float32 (:data:`MAX_FLOAT`, torch's default dtype), so a huge value
is one line here rather than an overflow deep inside torch. Flags are never abbreviated
(``--meth`` is not ``--method``). Nothing here imports torch, so the numpy tools start without
it.
"""

from __future__ import annotations

import argparse
import copy
import math
import signal
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .errors import PBInputError
from .io import path_problem

if TYPE_CHECKING:
    from collections.abc import Callable

#: Largest integer any integer type accepts: 2**63 - 1, a signed 64-bit integer (torch's seeds,
#: sizes and thread counts are C integers; larger values overflow inside torch).
MAX_INT = 2**63 - 1
#: Largest number any number type accepts: the largest float32 (torch's default dtype; a larger
#: learning rate cannot even be converted to a float32 step).
MAX_FLOAT = float.fromhex("0x1.fffffep+127")
#: Most torch threads a ``--threads`` takes (:data:`thread_count`); more is no machine's core
#: count, and torch would try to start that many threads.
MAX_THREADS = 1024


def _argparse_error(message: str) -> Exception:
    return argparse.ArgumentTypeError(message)


def default_text(value: Any) -> str:
    """How ``--help`` writes an option's default: lists and tuples space-separated (as they are
    typed), floats in ``%g`` form, everything else with ``str``."""
    if isinstance(value, (list, tuple)):
        return " ".join(default_text(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def default_spellings(value: Any) -> list[str]:
    """The ways a help text may already write ``value`` (``10000``, ``10,000``, ``10_000``,
    ``0.0001``, ``1e-4`` ...); a help that says "default" and one of these shows its default."""
    out = {default_text(value), str(value)}
    if isinstance(value, bool):
        return sorted(out)
    if isinstance(value, int):
        out |= {f"{value:,}", f"{value:_}"}
    elif isinstance(value, float):
        out |= {repr(value), f"{value:,g}"}
        mantissa, _, exponent = f"{value:e}".partition("e")
        out.add(f"{float(mantissa):g}e{int(exponent)}")
        if value.is_integer():
            out |= {f"{int(value)}", f"{int(value):,}"}
    elif isinstance(value, (list, tuple)):
        out |= {",".join(map(default_text, value)), ", ".join(map(default_text, value))}
    return sorted(out)


def shows_default(action: argparse.Action) -> bool:
    """Whether ``--help`` must show this action's default: a listed option (not a positional,
    not a flag such as ``store_true``, not a hidden one) whose default is neither None nor
    suppressed."""
    return bool(action.option_strings) and action.nargs != 0 and action.default is not None \
        and action.default is not argparse.SUPPRESS and action.help is not argparse.SUPPRESS


def help_shows_default(help_text: str, value: Any) -> bool:
    """Whether a help text already states the default ``value``."""
    return "%(default)" in help_text or ("default" in help_text.lower() and any(
        s in help_text for s in default_spellings(value)))


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` of every tool: descriptions and epilogs keep their line breaks (a line longer
    than the terminal is wrapped at its indentation), and each option with a default ends with
    ``(default: X)`` unless its help already says it (an option without help text gets that as
    its help)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for line in text.splitlines():
            body = line.strip()
            lead = indent + line[: len(line) - len(line.lstrip())]
            if len(lead) + len(body) <= width or not body:
                out.append((lead + body) if body else "")
            else:
                out += textwrap.wrap(body, width, initial_indent=lead, subsequent_indent=lead)
        return "\n".join(out)

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and shows_default(action):
            action = copy.copy(action)
            action.help = self._get_help_string(action)
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if shows_default(action) and not help_shows_default(text, action.default):
            shown = default_text(action.default).replace("%", "%%")
            text = f"{text} (default: {shown})" if text else f"default: {shown}"
        return text


class VersionAction(argparse.Action):
    """``--version``: prints :func:`pbexact.provenance.version_text` (version, import path,
    git commit and dirty flag, read when asked) and exits 0."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:  # noqa: A002
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from .provenance import version_text

        print(version_text(parser.prog))
        parser.exit()


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line, ``error: ...; see PROG --help``, exit
    code 2, like the :class:`PBInputError` messages of every tool, whose ``--help`` shows every
    default (:class:`DefaultsHelpFormatter`, unless another ``formatter_class`` is given), which
    takes no abbreviated flag (``allow_abbrev=False`` unless asked otherwise) and which has
    ``--version`` (:class:`VersionAction`; ``version=False``: none, as for subcommands)."""

    def __init__(self, *args: Any, version: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # --meth is not --method: a typo is refused
        super().__init__(*args, **kwargs)
        if version and self.add_help:
            self.add_argument("--version", action=VersionAction,
                              help="print the package version, the folder it was imported "
                                   "from and its git commit, then exit")

    def add_subparsers(self, **kwargs: Any) -> Any:
        """Subcommands' parsers are of this class too, without their own ``--version``."""
        kwargs.setdefault("parser_class", _SubParser)
        return super().add_subparsers(**kwargs)

    def parse_args_or_code(self, argv: list[str] | None = None) -> argparse.Namespace | int:
        """:meth:`parse_args`, with argparse's exits returned as the exit code instead of raised
        (2 after its one-line error, 0 after ``--help``), for a tool's ``main`` to return."""
        try:
            return self.parse_args(argv)
        except SystemExit as exc:
            return int(exc.code or 0)

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}; see {self.prog} --help", file=sys.stderr)
        raise SystemExit(2)


def given_options(parser: argparse.ArgumentParser, argv: list[str] | None) -> set[str]:
    """The destinations of the options named on the command line ``argv`` (None:
    ``sys.argv[1:]``), whatever their values (a default given explicitly counts): ``argv``
    parsed again by a copy of ``parser`` with every default suppressed. Call it after the
    parser accepted ``argv``."""
    copied = copy.deepcopy(parser)
    for action in copied._actions:  # argparse has no public list of its actions
        action.default = argparse.SUPPRESS
    copied._defaults.clear()  # set_defaults values are not options
    return set(vars(copied.parse_args(argv)))


class _SubParser(ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, version=False, **kwargs)


def _parse_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _argparse_error(f"expected an integer, got {text!r}") from None
    if value > MAX_INT:
        raise _argparse_error(f"must be at most 2**63 - 1 = {MAX_INT:,} (a signed 64-bit "
                              f"integer, what torch and numpy take), got {text}")
    return value


def integer(text: str) -> int:
    """argparse type: any integer (within a signed 64-bit one)."""
    return _parse_int(text)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = _parse_int(text)
    if value < 1:
        raise _argparse_error(f"must be a positive integer (>= 1), got {value}")
    return value


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0 (seeds, instance numbers)."""
    value = _parse_int(text)
    if value < 0:
        raise _argparse_error(f"must be an integer >= 0, got {value}")
    return value


def _parse_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _argparse_error(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise _argparse_error(f"must be a finite number, got {text}")
    if abs(value) > MAX_FLOAT:
        raise _argparse_error(f"must be at most {MAX_FLOAT:.4g} in absolute value (the largest "
                              f"float32, torch's default dtype), got {text}")
    return value


def finite_float(text: str) -> float:
    """argparse type: any finite number (within float32's range)."""
    return _parse_float(text)


def boolean(text: str) -> bool:
    """argparse type: true or false (also yes/no, on/off, 1/0; any case)."""
    word = str(text).strip().lower()
    if word in ("true", "yes", "on", "1"):
        return True
    if word in ("false", "no", "off", "0"):
        return False
    raise _argparse_error(f"expected true or false, got {text!r}")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (learning rates, temperatures)."""
    value = _parse_float(text)
    if value <= 0:
        raise _argparse_error(f"must be a number > 0, got {text}")
    return value


def nonneg_float(text: str) -> float:
    """argparse type: a finite number >= 0 (regularizer weights)."""
    value = _parse_float(text)
    if value < 0:
        raise _argparse_error(f"must be a number >= 0, got {text}")
    return value


def int_in_range(minimum: int, maximum: int, why: str = "") -> Any:
    """argparse type factory: an integer from ``minimum`` to ``maximum``; ``why`` (e.g. "a 2^d
    table per d") says in the error what the upper bound stands for."""

    def parse(text: str) -> int:
        value = _parse_int(text)
        if value < minimum:
            raise _argparse_error(f"must be an integer >= {minimum}, got {value}")
        if value > maximum:
            because = f" ({why})" if why else ""
            raise _argparse_error(f"must be at most {maximum:,}{because}, got {value:,}")
        return value

    parse.__name__ = f"int_in_range_{minimum}_{maximum}"
    return parse


#: argparse type of ``--threads``: 1 to :data:`MAX_THREADS` torch threads.
thread_count = int_in_range(1, MAX_THREADS, "torch threads per process; no machine here has "
                            "more cores")
thread_count.__name__ = "thread_count"


#: Most SGD steps a ``--steps`` of the exact-side tools takes (the paper's runs take 10,000; a
#: billion steps of the smallest microworld run, at about 200 µs a step, take two days).
MAX_STEPS = 10**9


def step_count(minimum: int = 1) -> Any:
    """argparse type factory: a number of SGD steps from ``minimum`` to :data:`MAX_STEPS`."""
    parse = int_in_range(minimum, MAX_STEPS, "the paper's runs take 10,000")
    parse.__name__ = f"step_count_{minimum}"
    return parse


def out_folder(text: str) -> Path:
    """argparse type of an output folder (``--out``): refuses an empty path (which would mean the
    current folder), a NUL and names too long for the file system
    (:func:`pbexact.io.path_problem`)."""
    problem = path_problem(text)
    if problem:
        raise _argparse_error(f"the path {text[:60]!r} {problem}; name a folder")
    return Path(text)


def choice_list(choices: tuple[str, ...], what: str, invalid: str = "invalid choice:") -> Any:
    """argparse type factory: comma-separated names of ``choices``, each once, as a list;
    ``what`` names them in the message (plural, e.g. "models"), ``invalid`` opens it."""

    def parse(text: str) -> list[str]:
        parts = [v.strip() for v in text.split(",")]
        bad = [v for v in parts if v not in choices]
        if bad or len(set(parts)) != len(parts):
            raise _argparse_error(f"{invalid} {(bad or parts)[0]!r}; give comma-separated "
                                  f"{what}, each once, of {', '.join(choices)}")
        return parts

    return parse


def positive_int_list(text: str) -> list[int]:
    """argparse type: a comma-separated list of integers >= 1, e.g. ``2,10,100``."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise _argparse_error(f"expected comma-separated positive integers like 2,10,100, "
                              f"got {text!r}")
    return [positive_int(p) for p in parts]


def _parse_seeds(text: str, limit: int | None, what: str = "seeds") -> list[int]:
    out: set[int] = set()
    try:
        for part in text.split(","):
            if "-" in part.strip()[1:]:
                a, b = (int(x) for x in part.split("-", 1))
                if max(a, b) > MAX_INT:  # before the range is expanded
                    raise _seed_too_large(text)
                if limit is not None and b - a + 1 > limit:
                    raise _argparse_error(f"at most {limit:,} {what}, got the range "
                                          f"{part.strip()} of {b - a + 1:,}")
                out.update(range(a, b + 1))
            else:
                out.add(int(part))
            if limit is not None and len(out) > limit:
                raise _argparse_error(f"at most {limit:,} {what}, got more in {text!r}")
    except ValueError:
        raise _argparse_error(f"give a range like 0-9 or a list like 0,2,5, got {text!r}"
                              ) from None
    if not out or min(out) < 0:
        raise _argparse_error(f"seeds are integers >= 0, got {text!r}")
    if max(out) > MAX_INT:
        raise _seed_too_large(text)
    return sorted(out)


def _seed_too_large(text: str) -> Exception:
    return _argparse_error(f"seeds are at most 2**63 - 1 = {MAX_INT:,} (a signed 64-bit "
                           f"integer), got {text!r}")


def one_or_list(kind: Any) -> Any:
    """argparse type: ``kind`` (e.g. :func:`positive_float`) of one value, or of each value of
    a comma list (then a list: e.g. the runs of a pruning group)."""

    def parse(text: str) -> Any:
        parts = [v.strip() for v in str(text).split(",")]
        values = [kind(v) for v in parts]
        return values if len(values) > 1 else values[0]

    parse.__name__ = kind.__name__
    parse.kind = kind  # the shared type of each value (tests/test_runtools.py)
    return parse


def seed_list(text: str) -> list[int]:
    """argparse type: seeds (integers >= 0) as ranges and lists, ``0-9`` or ``0,2,5`` or
    ``0-3,7``, returned sorted without repeats."""
    return _parse_seeds(text, None)


def seed_list_at_most(limit: int, what: str = "seeds") -> Any:
    """argparse type factory: :func:`seed_list` with at most ``limit`` seeds (``what``: how the
    error names them), refused before a range is expanded (``0-100000000`` is one line, not a
    memory error)."""

    def parse(text: str) -> list[int]:
        return _parse_seeds(text, limit, what)

    parse.__name__ = f"seed_list_at_most_{limit}"
    parse.kind = seed_list  # a bounded seed_list (tests/test_runtools.py)
    return parse


def int_at_least(minimum: int) -> Any:
    """argparse type factory: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        value = _parse_int(text)
        if value < minimum:
            raise _argparse_error(f"must be an integer >= {minimum}, got {value}")
        return value

    parse.__name__ = f"int_at_least_{minimum}"
    return parse


def resume_command() -> str:
    """The command line that started this process (``python -m MODULE ARGS`` for a module),
    which resumes an interrupted run."""
    import shlex

    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["python", "-m", spec.name] if spec is not None and spec.name else (
        ["python", sys.argv[0]] if sys.argv and sys.argv[0] else [])
    return shlex.join(head + sys.argv[1:]) if head else "the same command"


def run_main(body: Callable[[], int | None], resumable: bool = False) -> int:
    """Run a tool's ``body`` and map how it ends to its exit code, the one mapping of every
    tool's ``main``: its return value (None: 0); bad input (:class:`PBInputError`): ``error:
    ...`` on stderr and 2; a run stopped by a signal after its checkpoint
    (:class:`RunInterrupted`): its message, how to resume, and 143 (SIGTERM) or 130 (SIGINT);
    Ctrl-C elsewhere (``KeyboardInterrupt``): one line and 130 (``resumable``: with the command
    that resumes; one carrying ``signum``, as SIGTERM under ``analysis.cli.stop_signals``:
    128 + signum); a write that failed (:class:`~pbexact.io.WriteError`: disk full, quota,
    read-only folder): one line naming the file and the space it needed, and 2; argparse's
    exits (already one line): their code."""
    from .errors import RunInterrupted
    from .io import WriteError

    try:
        return int(body() or 0)
    except PBInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(f"{exc}; resume with: {resume_command()}", file=sys.stderr)
        return exc.code
    except WriteError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # a KeyboardInterrupt raised for SIGTERM (``analysis.cli.stop_signals``) carries signum
        signum = int(getattr(exc, "signum", signal.SIGINT))
        resume = f"; resume with: {resume_command()}" if resumable else ""
        name = f"{signal.Signals(signum).name}: " if hasattr(exc, "signum") else ""
        print(f"{name}interrupted{resume}", file=sys.stderr)
        return 128 + signum
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
