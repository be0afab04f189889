"""One index per pip route (preflight/common.py pip_indexes), and pip's URL and host words (vllm_syntax).

pip takes every package from whichever of its indexes offers the highest version, so a second index can replace
any package of the first (dependency confusion): extra indexes are refused unless their opt-in is set. Each URL and
trusted host is checked as pip reads it, before any host changes.
"""

import urllib.parse

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.vllm.cpu_fleet.plugins.action import vllm_preflight as action
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_syntax as syntax
from hypothesis import given
from hypothesis import strategies as st

TORCH_CPU = "https://download.pytorch.org/whl/cpu"


def typed(role, **task_vars):
    merged = action.ActionModule._variables(dict({"vllm_fleet_controller_cache": "/srv/cache"}, **task_vars), [])
    templar = Templar(loader=DataLoader(), variables={}).copy_with_new_env(available_variables=merged)
    _values, problems, unreadable = action.ActionModule._typed("h1", role, merged, templar)
    return problems + unreadable


@pytest.mark.parametrize("role", ["vllm_install", "vllm_build"])
def test_an_extra_index_is_refused_without_its_opt_in(role):
    (problem,) = typed(role, **{f"{role}_pip_extra_index_urls": [TORCH_CPU]})
    assert problem.startswith(f"h1: {role}_pip_extra_index_urls: is ['{TORCH_CPU}'], more indexes beside the one in")
    assert "dependency confusion" in problem
    assert f"fix: serve every package from one index ({role}_pip_index_url:" in problem
    assert f"or set {role}_pip_allow_extra_indexes: true to accept the mix." in problem
    mirror = {f"{role}_pip_index_url": "https://mirror.example.com/simple"}
    (problem,) = typed(role, **mirror, **{f"{role}_pip_extra_index_urls": [TORCH_CPU]})
    assert "more indexes beside https://mirror.example.com/simple," in problem


@pytest.mark.parametrize("role", ["vllm_install", "vllm_build"])
def test_the_opt_in_lets_an_extra_index_through(role):
    assert typed(role, **{f"{role}_pip_extra_index_urls": [TORCH_CPU], f"{role}_pip_allow_extra_indexes": True}) == []
    # From -e the opt-in arrives as text: read as the argument spec reads a bool, "false" as false.
    assert typed(role, **{f"{role}_pip_extra_index_urls": [TORCH_CPU], f"{role}_pip_allow_extra_indexes": "true"}) == []
    problems = typed(role, **{f"{role}_pip_extra_index_urls": [TORCH_CPU], f"{role}_pip_allow_extra_indexes": "false"})
    assert len(problems) == 1 and "dependency confusion" in problems[0]


@pytest.mark.parametrize("role", ["vllm_install", "vllm_build"])
def test_one_index_needs_no_opt_in(role):
    assert typed(role, **{f"{role}_pip_index_url": "https://mirror.example.com/simple"}) == []
    assert typed(role) == []


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://mirror.example.com/simple", "plain http"),
        ("https://user:secret@mirror.example.com/simple", "carries credentials"),
        ("https://token@mirror.example.com/simple", "carries credentials"),
        ("--trusted-host=evil.example.com", "no http(s) URL with a host"),
        ("file:///srv/wheels", "no http(s) URL with a host"),
        ("https://mirror.example.com/simple --no-deps", "no URL read as one word"),
        ("https://mirror.example.com/simple\n", "no URL read as one word"),
        ("https://mïrror.example.com/simple", "no URL read as one word"),
        ("https://mirror_example/simple", "has no DNS name or IP address as its host"),
        ("https://mirror.example.com:99999/simple", "has no DNS name or IP address as its host"),
        ("https:///simple", "no http(s) URL with a host"),
        ("https://::/simple", "has no DNS name or IP address as its host"),  # IPv6 without brackets (Hypothesis)
    ],
)
def test_an_index_url_pip_would_misread_or_that_leaks_is_refused_naming_host_and_variable(url, words):
    problems = typed("vllm_install", vllm_install_pip_index_url=url)
    assert any(problem.startswith(f"h1: vllm_install_pip_index_url: is {url!r}, ") for problem in problems), problems
    assert any(words in problem and "; fix: " in problem for problem in problems), problems


def test_an_ipv6_index_is_written_in_brackets():
    assert typed("vllm_install", vllm_install_pip_index_url="https://[fd00::5]:8443/simple") == []


def test_a_plain_http_mirror_passes_once_its_host_is_trusted():
    url = "http://mirror.internal:8080/simple"
    for trusted in ("mirror.internal", "mirror.internal:8080"):
        assert typed("vllm_build", vllm_build_pip_index_url=url, vllm_build_pip_trusted_hosts=[trusted]) == []
    (problem,) = typed("vllm_build", vllm_build_pip_index_url=url, vllm_build_pip_trusted_hosts=["other.internal"])
    assert "plain http" in problem


@pytest.mark.parametrize("trusted", ["mirror example", "-k", "https://mirror.example.com", "mirror.example.com:0", ""])
def test_a_trusted_host_is_a_host(trusted):
    (problem,) = typed("vllm_install", vllm_install_pip_trusted_hosts=[trusted])
    assert problem.startswith(f"h1: vllm_install_pip_trusted_hosts: is {trusted!r}, no host pip's --trusted-host")


def test_a_templated_index_is_checked_as_rendered():
    problems = typed("vllm_install", vllm_install_pip_index_url=trust_as_template("http://{{ 'mirror' }}/simple"))
    assert problems and "is 'http://mirror/simple'" in problems[0]


# Characters pip's and the URL parser's readers treat specially, mixed with ordinary ones.
URL_CHARS = st.sampled_from(list(" \t\n\x00\x7f#'\"\\$`;&|<>(){}[]*?~=:@!,+./-_%é") + list("abcxyz0189"))


@given(st.text(alphabet=URL_CHARS, max_size=40))
def test_an_accepted_index_url_is_one_https_url_with_a_host_and_no_credentials(tail):
    for url in (tail, "https://" + tail, "http://" + tail):
        if syntax.pip_index_url(url, trusted_hosts=()) is not None:
            continue
        parts = urllib.parse.urlsplit(url)
        assert parts.scheme == "https" and parts.hostname and parts.username is None and parts.password is None
        assert url.isascii() and url.isprintable() and " " not in url and not url.startswith("-")
        assert parts.port is None or 0 < parts.port < 65536


@given(st.text(alphabet=URL_CHARS, min_size=1, max_size=30))
def test_an_accepted_trusted_host_is_a_host_and_optional_port(text):
    if syntax.pip_trusted_host(text) is None:
        parts = urllib.parse.urlsplit("https://" + text)
        assert parts.hostname and parts.username is None and (parts.port is None or 0 < parts.port < 65536)
        assert not text.startswith("-") and text.isascii() and text.isprintable() and " " not in text
