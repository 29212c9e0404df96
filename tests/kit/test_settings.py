"""One declaration of the job settings (app/dglkit/settings.py): the files generated from it do not drift."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dglkit import chunkcmd, data, settings
from dglkit.__main__ import command_parser
from dglkit.common import digest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(settings.rendered(REPO)))
def test_the_generated_file_is_what_the_declaration_makes(name: str) -> None:
    assert (REPO / name).read_text() == settings.rendered(REPO)[name], f"{name}: run make settings"


def test_the_role_reads_the_declared_defaults_types_and_choices() -> None:
    # Read back as Ansible reads them: the YAML the generator writes means the declared values.
    defaults = yaml.safe_load((REPO / settings.DEFAULTS_FILE).read_text())
    specs = yaml.safe_load((REPO / settings.SPECS_FILE).read_text())["argument_specs"]
    for setting in settings.SETTINGS.values():
        assert defaults[setting.var] == setting.default, setting.var
        spec = specs["main"]["options"][setting.var]
        assert spec["type"] == setting.type and spec.get("choices", []) == list(setting.choices), setting.var
    assert set(defaults) == {s.var for s in settings.SETTINGS.values()}
    assert set(specs["main"]["options"]) == {s.var for s in settings.SETTINGS.values()}
    sample = yaml.safe_load((REPO / settings.SAMPLE_FILE).read_text())
    assert sample == {s.var: s.default for s in settings.SETTINGS.values() if s.sample == "value"}


def test_an_edited_file_is_named_and_make_settings_restores_it(tmp_path: Path) -> None:
    for name in settings.rendered(REPO):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    sample = tmp_path / settings.SAMPLE_FILE
    sample.write_text(sample.read_text().replace("dgl_job_epochs: 5", "dgl_job_epochs: 6"))
    command = [sys.executable, "-m", "dglkit", "settings", "--root", str(tmp_path)]
    check = subprocess.run(command, cwd=REPO / "app", capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and settings.SAMPLE_FILE in check.stderr and settings.DOCS_FILE not in check.stderr
    subprocess.run([*command, "--write"], cwd=REPO / "app", check=True, capture_output=True, timeout=60)
    assert sample.read_text() == (REPO / settings.SAMPLE_FILE).read_text()


def test_other_roles_take_the_declared_defaults(tmp_path: Path) -> None:
    """dgl_dataset, dgl_job_control, firewall and the kit-wide dglkit_server_port default to the declared value,
    and an edited one is named like any generated file."""
    for name, mirrored in settings.MIRRORS.items():
        data = yaml.safe_load((REPO / name).read_text())
        for var, setting in mirrored:
            if "argument_specs" in name:
                value = next(entry["options"][var]["default"] for entry in data["argument_specs"].values()
                             if var in entry.get("options", {}))
            else:
                value = data[var]
            assert value == settings.SETTINGS[setting].default, (name, var)
    for name in settings.rendered(REPO):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    firewall = tmp_path / "roles/firewall/defaults/main.yml"
    firewall.write_text(firewall.read_text().replace("firewall_rendezvous_port: 29500", "firewall_rendezvous_port: 29501"))
    check = subprocess.run([sys.executable, "-m", "dglkit", "settings", "--root", str(tmp_path)], cwd=REPO / "app",
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "roles/firewall/defaults/main.yml" in check.stderr, check.stderr


def role_synthetic_arguments() -> list[str]:
    """The synthetic graph's options that the dgl_dataset role passes to `prepare` and `chunked generate`, with the
    role's defaults rendered as Ansible renders them (text); checks that the argument spec says the same."""
    role = REPO / "roles/dgl_dataset"
    passed = yaml.safe_load((role / "tasks/prepare.yml").read_text())[0]["vars"]["_synthetic"]
    defaults = yaml.safe_load((role / "defaults/main.yml").read_text())
    specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    arguments = []
    for option, value in zip(passed[::2], passed[1::2]):
        var = re.fullmatch(r"\{\{ (dgl_dataset_\w+) \}\}", value)
        assert var, f"prepare.yml's _synthetic: {option} {value}"
        assert specs[var[1]]["default"] == defaults[var[1]], var[1]
        # The option takes its default from the job setting the role's variable mirrors.
        assert data.SYNTHETIC_SETTINGS[option[2:].replace("-", "_")] == var[1].removeprefix("dgl_dataset_"), option
        arguments += [option, str(defaults[var[1]])]
    assert len(arguments) == 2 * len(data.SYNTHETIC_SETTINGS)
    return arguments


@pytest.mark.parametrize("dataset", ["synthetic", "synthetic-hetero"])
def test_the_synthetic_graph_by_hand_is_the_one_of_the_default_settings(dataset: str) -> None:
    """`dglkit prepare --dataset synthetic` and `chunked generate` without options make what train.yml makes with the
    default settings: the same parameters, hence the same fingerprint and chunk manifests."""
    role = role_synthetic_arguments()
    parser = command_parser(["prepare", "chunked"])
    prepare = ["prepare", "--dataset", dataset, "--out", "ds"]
    by_hand, by_role = parser.parse_args(prepare), parser.parse_args(prepare + role)
    assert digest(data.check_arguments(by_hand)) == digest(data.check_arguments(by_role))
    generate = ["chunked", "generate", "--out", "chunks", "--dataset", dataset, "--num-chunks", "2"]
    by_hand, by_role = parser.parse_args(generate), parser.parse_args(generate + role)
    assert json.dumps(chunkcmd.generate_params(by_hand)) == json.dumps(chunkcmd.generate_params(by_role))
