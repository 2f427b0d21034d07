"""Config that fails clearly: every problem in the file, the environment or the flags, one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_shim.loading import ConfigError, load

EXAMPLE = Path(__file__).parent.parent / "examples" / "sidecar.toml"


def problems(path: str | None, flags: dict | None = None, environ: dict | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(path, flags or {}, environ or {})
    assert str(caught.value) == "\n".join(str(p) for p in caught.value.problems)
    return [str(p) for p in caught.value.problems]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "shim.toml"
    path.write_text(text)
    return str(path)


def test_every_server_key_problem_is_one_line_naming_file_key_and_expected_type(tmp_path):
    path = write(tmp_path, '[server]\nport = "abc"\nhost = 5\nprot = 8787\n')
    lines = problems(path)
    assert len(lines) == 3
    assert f"{path}: server.port: expected a valid integer" in lines[1] and "got 'abc'" in lines[1]
    assert lines[0] == f"{path}: server.host: expected a valid string, got 5"
    assert lines[2] == f"{path}: server.prot: unknown key (did you mean 'port'?)"


def test_deployment_problems_name_the_deployment_and_the_key(tmp_path):
    path = write(
        tmp_path,
        '[[deployments]]\nname = "gpu"\nkind = "openai_compatible"\nmodels = { a = "b" }\n'
        '[[deployments]]\nname = "cpu"\nkind = "simulated"\nmodels = { a = "b" }\nmax_concurrency = 0\n'
        '[routing]\npolicy = "fastest"\n',
    )
    lines = problems(path)
    assert f"{path}: deployments[0] ('gpu'): deployment 'gpu': kind 'openai_compatible' needs a base_url" in lines
    assert any(line.startswith(f"{path}: deployments[1] ('cpu').max_concurrency: expected") for line in lines)
    assert any(line.startswith(f"{path}: routing.policy: expected 'priority' or 'least_latency'") for line in lines)


def test_a_kind_no_plugin_provides_is_named_with_its_deployment(tmp_path):
    path = write(tmp_path, '[[deployments]]\nname = "gpu"\nkind = "vllm"\nmodels = { a = "b" }\n')
    (line,) = problems(path)
    assert line.startswith(f"{path}: deployments[0] ('gpu'): deployment 'gpu': no plugin provides backend kind 'vllm'")


def test_unreadable_and_malformed_files_are_one_line(tmp_path):
    assert problems(str(tmp_path / "missing.toml")) == [
        f"{tmp_path / 'missing.toml'}: cannot read the file: No such file or directory"
    ]
    path = write(tmp_path, "port = [\n")
    (line,) = problems(path)
    assert line.startswith(f"{path}: not valid TOML: ")


def test_environment_variables_are_validated_and_named():
    lines = problems(None, environ={"RESPONSES_WS_PORT": "abc", "RESPONSES_WS_MAX_LANES": "0"})
    assert any(line.startswith("environment: RESPONSES_WS_PORT: expected a valid integer") for line in lines)
    assert any(line.startswith("environment: RESPONSES_WS_MAX_LANES: expected") for line in lines)


def test_list_variables_take_comma_separated_values_or_json():
    assert load(None, {}, {"RESPONSES_WS_API_KEYS": "sk-1, sk-2"}).settings.api_keys == ["sk-1", "sk-2"]
    assert load(None, {}, {"RESPONSES_WS_API_KEYS": '["sk-1"]'}).settings.api_keys == ["sk-1"]
    (line,) = problems(None, environ={"RESPONSES_WS_API_KEYS": "[not json"})
    assert line.startswith("environment: RESPONSES_WS_API_KEYS: expected a valid list")


def test_flags_override_the_environment_which_overrides_the_file(tmp_path):
    path = write(tmp_path, "[server]\nport = 1111\nhost = '127.0.0.2'\nmax_lanes = 4\n")
    loaded = load(path, {"port": 3333}, {"RESPONSES_WS_PORT": "2222", "RESPONSES_WS_HOST": "127.0.0.3"})
    assert (loaded.settings.port, loaded.settings.host, loaded.settings.max_lanes) == (3333, "127.0.0.3", 4)


def test_a_flag_out_of_range_is_named_as_the_flag():
    assert problems(None, {"port": 70000}) == ["flag: --port: expected less than or equal to 65535, got 70000"]


def test_warnings_for_an_open_bind_an_unset_key_variable_and_a_mistyped_variable():
    loaded = load(str(EXAMPLE), {"host": "0.0.0.0"}, {"RESPONSES_WS_PROT": "1", "RESPONSES_WS_TRANSPORT": "http"})
    text = "\n".join(loaded.warnings)
    assert "listening on 0.0.0.0 with no api key" in text
    assert "deployment 'cerebras': api_key_env CEREBRAS_API_KEY is not set" in text
    assert "RESPONSES_WS_PROT is not a server setting and is ignored (did you mean RESPONSES_WS_PORT?)" in text
    assert "RESPONSES_WS_TRANSPORT" not in text, "a client-side variable is not a mistake"
    quiet = load(str(EXAMPLE), {"api_keys": ["k"], "host": "0.0.0.0"}, {"CEREBRAS_API_KEY": "x"})
    assert quiet.warnings == []


def test_a_warning_for_any_web_origin_without_a_key():
    loaded = load(str(EXAMPLE), {}, {"CEREBRAS_API_KEY": "x", "RESPONSES_WS_ALLOWED_ORIGINS": "*"})
    assert loaded.settings.allowed_origins == ["*"]
    assert any("allowed_origins '*' with no api key" in warning for warning in loaded.warnings)
    listed = load(
        str(EXAMPLE),
        {},
        {"CEREBRAS_API_KEY": "x", "RESPONSES_WS_ALLOWED_ORIGINS": "https://a.example,https://b.example"},
    )
    assert listed.settings.allowed_origins == ["https://a.example", "https://b.example"] and listed.warnings == []


def test_without_deployments_the_backend_setting_is_the_one_deployment(tmp_path):
    path = write(tmp_path, '[server]\nbackend = "http://127.0.0.1:9/v1"\n[routing]\nhealth_interval_s = 2\n')
    loaded = load(path, {}, {})
    assert [(d.name, d.base_url) for d in loaded.config.deployments] == [("default", "http://127.0.0.1:9/v1")]
    assert loaded.config.routing.health_interval_s == 2 and not loaded.from_file


@pytest.mark.parametrize(
    ("keys", "flags", "said"),
    [
        ([], {}, "auth off: no api key is required"),
        (["k1"], {}, "auth on: 1 api key(s), 1 tenant(s), no per-tenant connection cap"),
        (
            ["k1", "k2"],
            {},
            "auth on: 2 api key(s), 2 tenant(s), each at most 512 WebSocket connections, 256 kept free for each",
        ),
        (
            ["k1", "k2"],
            {"tenant_max_connections": 0},
            "auth on: 2 api key(s), 2 tenant(s), no per-tenant connection cap",
        ),
        (
            ["k1", "k2"],
            {"max_connections": 10},
            "auth on: 2 api key(s), 2 tenant(s), each at most 5 WebSocket connections, 2 kept free for each",
        ),
    ],
)
def test_the_auth_summary_names_keys_tenants_and_the_per_tenant_connection_cap_in_force(keys, flags, said):
    assert load(None, {"api_keys": keys, **flags}, environ={}).auth_summary() == said
