"""One declaration of the job settings (app/dglkit/settings.py): the files generated from it do not drift."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dglkit import settings

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
