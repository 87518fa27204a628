"""The output registry (``layerscope.base.formats``): one table keyed by (document kind,
format) that drives each document's ``render``/``save``, the checks of every option, and
the CLI's ``--format`` choices and option flags."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import layerscope
from layerscope import cli, zoo
from layerscope.base import formats
from layerscope.base.errors import OptionError
from layerscope.base.formats import DOCUMENTS, Option, register_renderer
from layerscope.render.options import count


def count_mlp(seed: int) -> layerscope.Profile:
    torch.manual_seed(seed)
    entry = zoo.get("mlp")
    return layerscope.count_flops(entry.build(), entry.example_inputs(2))


@pytest.fixture(scope="module")
def mlp() -> layerscope.Profile:
    return count_mlp(0)


@pytest.fixture
def registered() -> Iterator[list[tuple[str, str]]]:
    """Formats a test registers, removed afterwards (the registry is process-wide)."""
    added: list[tuple[str, str]] = []
    yield added
    for document, name in added:
        del formats._TABLES[document][name]
    for name in [n for n in formats._OPTIONS if n.startswith("shout")]:
        del formats._OPTIONS[name]


def test_every_document_class_names_its_table(mlp: layerscope.Profile) -> None:
    assert formats.document_kind(mlp) == "profile"
    assert formats.document_kind(mlp.ops()) == "op-table"
    assert formats.document_kind(layerscope.diff(mlp, mlp)) == "diff"
    with pytest.raises(TypeError, match="cannot render a dict"):
        formats.document_kind({})
    # Each kind has a text or chrome format: nothing registered is unreachable.
    assert all(formats.formats(kind) for kind in DOCUMENTS)


def test_a_format_refuses_an_option_it_does_not_take_and_names_those_it_does(mlp: layerscope.Profile) -> None:
    with pytest.raises(OptionError, match=r"the json format has no option 'depth'; it takes: indent"):
        mlp.render("json", depth=2)
    with pytest.raises(OptionError, match=r"the html format has no option 'width'; it takes: no options"):
        mlp.save("never.html", width=80)
    assert not Path("never.html").exists()
    with pytest.raises(OptionError, match="the text format of a diff of two profiles has no option 'depth'"):
        layerscope.diff(mlp, mlp).render("text", depth=1)
    # An OptionError is a TypeError, as Python's own for an unexpected keyword.
    assert issubclass(OptionError, TypeError)


def test_convenience_methods_delegate_to_the_registry(mlp: layerscope.Profile, tmp_path: Path) -> None:
    assert mlp.render("text", depth=1) == formats.render(mlp, "text", depth=1)
    assert mlp.ops(group_by="shape").render() == formats.render(mlp.ops(group_by="shape"), "text")
    mlp.save(tmp_path / "mlp.csv", ops=True)
    assert (tmp_path / "mlp.csv").read_text(encoding="utf-8") == mlp.render("csv", ops=True)


def test_registration_checks_options_against_the_function(registered: list[tuple[str, str]]) -> None:
    with pytest.raises(ValueError, match="has no keyword parameter 'loud'"):

        @register_renderer("shout-a", options=(Option("loud", "x", parse=None),))
        def no_such_keyword(profile: object, *, quiet: bool = False) -> str:
            return ""

    with pytest.raises(ValueError, match="option 'depth' is already registered with another meaning"):

        @register_renderer("shout-b", options=(Option("depth", "how deep the shout goes"),))
        def other_depth(profile: object, *, depth: int = 0) -> str:
            return ""

    assert "shout-a" not in formats.formats() and "shout-b" not in formats.formats()


def test_a_registered_format_gets_its_flag_and_choice_in_the_cli(
    registered: list[tuple[str, str]], mlp: layerscope.Profile, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loud = Option("shout_times", "say it N times", parse=count, metavar="N")

    @register_renderer("shout", extensions=(".shout",), options=(loud,))
    def render_shout(profile: layerscope.Profile, *, shout_times: int = 1) -> str:
        return (profile.root.type.upper() + "!\n") * shout_times

    registered.append(("profile", "shout"))
    mlp.save(tmp_path / "mlp.json")
    assert cli.main(["show", str(tmp_path / "mlp.json"), "--format", "shout", "--shout-times", "3"]) == 0
    assert capsys.readouterr().out == "MLP!\n" * 3
    # Its extension picks it, and its flag is refused for another format.
    assert cli.main(["show", str(tmp_path / "mlp.json"), "-o", str(tmp_path / "x.shout")]) == 0
    assert (tmp_path / "x.shout").read_text(encoding="utf-8") == "MLP!\n"
    assert cli.main(["show", str(tmp_path / "mlp.json"), "--shout-times", "2"]) == 2
    assert "--shout-times: only for --format shout (the format here is text)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["show", str(tmp_path / "mlp.json"), "--format", "shout", "--shout-times", "-1"])
    assert "argument --shout-times: expected a number >= 0, got -1" in capsys.readouterr().err


def test_cli_lists_the_values_of_an_option_with_a_listing(capsys: pytest.CaptureFixture[str]) -> None:
    for flag, line in (("--columns", "  self_cpu"), ("--sort-by", "  self_alloc_bytes"), ("--group-by", "  stack:N")):
        with pytest.raises(SystemExit) as stop:
            cli.main(["show", "unused.json", flag, "list"])
        assert stop.value.code == 0
        assert line in capsys.readouterr().out


def test_cli_default_of_one_command_applies_only_where_the_format_takes_it(
    mlp: layerscope.Profile, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """diff's --limit defaults to 20 for text, and json (no limit option) is not refused."""
    wide = count_mlp(1)
    mlp.save(tmp_path / "a.json")
    wide.save(tmp_path / "b.json")
    assert cli.main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--format", "json"]) == 0
    assert capsys.readouterr().out.startswith("{")
    parser = cli.build_parser()
    args = parser.parse_args(["diff", "a.json", "b.json"])
    assert cli._format_options(args, "diff", "text") == {"limit": 20}
    assert cli._format_options(args, "diff", "json") == {}
    args = parser.parse_args(["diff", "a.json", "b.json", "--limit", "0"])
    assert cli._format_options(args, "diff", "text") == {"limit": 0}  # 0: every row
