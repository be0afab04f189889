"""plugin_utils/vllm_syntax.py: each destination's rule, checked against a model of the destination's own reader.

Every string a rule accepts, written the way the roles write it, must read back as exactly that string: HAProxy's
configuration tokenizer, bash running build.sh's `export`, systemd reading an environment file. Hypothesis draws the
strings from every character class the readers treat specially.
"""

import json
import os
import posixpath
import shlex
import subprocess

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_syntax as syntax
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import RELEASES, validate_row
from hypothesis import given, settings
from hypothesis import strategies as st

# Characters the destinations read otherwise, mixed into ordinary text so that Hypothesis tries them often.
SPECIAL = " \t\n\r\x00\x01\x7f#'\"\\$%`;&|<>(){}[]*?~=:@!,+./-_é\u2028"
texts = st.text(alphabet=st.sampled_from(SPECIAL) | st.characters(codec="utf-8"), max_size=24)
words = st.text(alphabet=st.sampled_from(SPECIAL + "abcAZ09"), min_size=1, max_size=16)


def haproxy_tokens(line):
    """The words HAProxy 2.6's cfgparse.c parse_line makes of one configuration line (what matters here: blanks
    separate, `#` outside quotes ends the line, quotes group, backslash escapes, NUL/CR/LF end the line)."""
    out, word, quote, index, started = [], [], None, 0, False
    while index < len(line):
        char = line[index]
        if char in "\x00\r\n":
            break
        if char == "\\" and index + 1 < len(line) and quote != "'":
            word.append(line[index + 1])
            started = True
            index += 2
            continue
        if quote:
            if char == quote:
                quote = None
            else:
                word.append(char)
            index += 1
            continue
        if char in "\"'":
            quote, started = char, True
        elif char == "#":
            break
        elif char in " \t":
            if started:
                out.append("".join(word))
            word, started = [], False
        else:
            word.append(char)
            started = True
        index += 1
    if started:
        out.append("".join(word))
    return out


def systemd_env_value(line):
    """The value systemd's env-file.c reads from `NAME="..."` (double-quoted: backslash before " \\ ` $ unescapes,
    before a line break continues, before anything else stays; the value ends at the closing quote)."""
    _unused, _sep, rest = line.partition("=")
    assert rest.startswith('"'), line
    value, index = [], 1
    while index < len(rest):
        char = rest[index]
        if char == '"':
            return "".join(value)
        if char == "\\" and index + 1 < len(rest):
            nxt = rest[index + 1]
            if nxt in '"\\`$':
                value.append(nxt)
            elif nxt != "\n":
                value += ["\\", nxt]
            index += 2
            continue
        value.append(char)
        index += 1
    return None  # no closing quote: systemd drops or misreads the line


def fits_a_unit_line(value):
    """A value systemd reads back from a unit setting (User=, WorkingDirectory=) as written: one non-empty line of
    printable ASCII with no `%`, which systemd would expand as a specifier."""
    return bool(value) and value.isascii() and value.isprintable() and "%" not in value


@settings(max_examples=400, deadline=None)
@given(st.lists(words, min_size=1, max_size=4))
def test_an_accepted_haproxy_word_tokenizes_back_to_itself(candidates):
    accepted = [word for word in candidates if syntax.haproxy_word(word) is None]
    line = "    acl fleet_allowed_route path_beg " + " ".join(accepted)
    assert haproxy_tokens(line) == ["acl", "fleet_allowed_route", "path_beg", *accepted]


@settings(max_examples=400, deadline=None)
@given(st.lists(words.map(lambda w: "/" + w), min_size=1, max_size=4))
def test_an_accepted_path_prefix_is_one_haproxy_word_and_a_request_path(candidates):
    accepted = [path for path in candidates if syntax.url_path(path, prefix=True) is None]
    line = "    acl fleet_allowed_route path_beg " + " ".join(accepted)
    assert haproxy_tokens(line) == ["acl", "fleet_allowed_route", "path_beg", *accepted]
    for path in accepted:
        assert path.startswith("/") and path != "/" and path.isascii()
        assert "/../" not in path + "/" and "/./" not in path + "/"


def test_the_hash_hole_of_the_held_out_set_is_closed():
    # haproxy.cfg.j2 joins the prefixes with blanks: `/v1/#x` left `path_beg /v1/`, and `/#` left `path_beg /`.
    assert haproxy_tokens("    acl a path_beg /#") == ["acl", "a", "path_beg", "/"]
    for prefix in ("/#", "/v1/#x", "/v1/ #", "/v1/\\#"):
        assert syntax.url_path(prefix, prefix=True) is not None, prefix


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(SPECIAL + "abcAZ09"), min_size=1, max_size=10), texts)
def test_an_accepted_name_and_value_come_out_of_build_sh_as_written(name, value):
    """build.sh.j2: `export {{ key }}={{ value | string | quote }}` (Ansible's quote is shlex.quote)."""
    if syntax.env_name(name) is not None or syntax.shell_value(value) is not None:
        return
    script = f"export {name}={shlex.quote(value)}\nprintf '%s' \"${{{name}}}\"\n"
    result = subprocess.run(["bash", "-c", script], capture_output=True, env={"PATH": os.environ["PATH"]}, check=False)
    assert result.returncode == 0 and result.stderr == b""
    assert result.stdout == value.encode("utf-8", "surrogateescape")


def test_the_build_env_hole_of_the_held_out_set_is_closed():
    # A line break in a name ran the rest of the line as a command on the builder.
    assert syntax.env_name("X\ntouch /tmp/pwned\nY") is not None
    row = dict(RELEASES["0.33.0"], version="0.34.0", git_tag="v0.34.0")
    row["build_isa_env"] = dict(row["build_isa_env"], x86_64={"X\ntouch /tmp/pwned\nY": "1"})
    (problem,) = validate_row("0.34.0", row)
    assert problem.startswith("vllm_release_overrides['0.34.0'].build_isa_env: ")
    assert "'X\\ntouch /tmp/pwned\\nY' is not a variable name VLLM_CPU_*" in problem
    assert "fix: regenerate the row" in problem


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("env_vars", {"VLLM_CPU_KVCACHE_SPACE\nLD_PRELOAD": {"type": "int", "default": None}}, "is not a VLLM_CPU_*"),
        ("env_vars", {"VLLM_CPU_X": {"type": "str", "default": "a\nb"}}, "not printable ASCII"),
        ("build_isa_env", {"x86_64/../..": {}}, "is not a wheel class name"),
        ("git_tag", "--upload-pack=touch /tmp/x", "a git tag"),
        ("build_requirements", "../../etc/passwd", "a path inside the source"),
        ("runtime_requirements", "requirements/cpu txt", "a path inside the source"),
        ("cpu_libraries", {"x86_64": ["_C", "_C;rm"], "other": ["_C"]}, "is not a module name"),
        ("serve_cli_distribution", "vllm\n", "the distribution name"),
        ("build_isa_env", {"x86_64": {"VLLM_CPU_AVX2\n": "1"}}, "is not a variable name"),
        ("build_isa_env", {"x86_64": {"BASH_ENV": "/tmp/x"}}, "is not a variable name VLLM_CPU_*"),
        ("gcc_workarounds", {"12.2": [{"patch": "../../../x.patch", "file": "a"}]}, "is not a relative path"),
    ],
)
def test_every_row_value_that_reaches_a_file_or_a_command_is_checked(key, value, words):
    row = dict(RELEASES["0.33.0"], version="0.34.0", git_tag="v0.34.0")
    row[key] = value
    problems = validate_row("0.34.0", row)
    assert len(problems) == 1 and f".{key}: " in problems[0] and words in problems[0], problems


def test_every_built_in_row_passes_the_destination_rules():
    for version, row in RELEASES.items():
        assert validate_row(version, row) == [], version


@settings(max_examples=400, deadline=None)
@given(texts)
def test_an_accepted_environment_file_value_reads_back_byte_for_byte(value):
    """instance.env.j2 and secrets.env.j2 write `NAME={{ value | to_json }}` (Ansible's to_json: json.dumps)."""
    if syntax.env_file_value(value) is None:
        assert systemd_env_value("X=" + json.dumps(value)) == value


@pytest.mark.parametrize("value", ["a\nb", "tab\there", "caf\u00e9", "\x7f", "\u2028"])
def test_what_the_environment_file_cannot_carry_is_refused(value):
    assert systemd_env_value("X=" + json.dumps(value)) != value
    assert syntax.env_file_value(value) is not None


@settings(max_examples=400, deadline=None)
@given(texts)
def test_an_accepted_bearer_token_is_carried_by_the_environment_file_and_an_http_header(token):
    if syntax.bearer_token(token) is None:
        assert systemd_env_value("X=" + json.dumps(token)) == token
        assert token == token.strip() and token.isascii() and token.isprintable() and " " not in token


@settings(max_examples=400, deadline=None)
@given(st.lists(words, max_size=5).map(lambda parts: "/" + "/".join(parts)))
def test_an_accepted_host_path_is_normalised_and_one_word_everywhere(path):
    if syntax.host_path(path) is not None:
        return
    assert posixpath.normpath(path) == path
    assert shlex.split(path) == [path] and haproxy_tokens(path) == [path]
    assert fits_a_unit_line(path)


@pytest.mark.parametrize(
    "path",
    ["/", "/etc", "/usr", "/var", "/root", "/home", "/usr/local", "/var/lib", "/etc/systemd/system", "/tmp", "/proc/x"],
)
def test_system_directories_are_never_owned(path):
    assert syntax.owned_directory(path, "the role owns") is not None


@pytest.mark.parametrize("path", ["/var/lib/vllm", "/opt/vllm", "/etc/vllm", "/home/vllm", "/srv/models/vllm"])
def test_directories_of_the_fleets_own_pass(path):
    assert syntax.owned_directory(path, "the role owns") is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["", ".", "..", "etc", "usr", "var", "lib", "vllm", "root", "home"]), max_size=4))
def test_an_owned_directory_is_no_system_directory_nor_above_one(parts):
    path = "/" + "/".join(parts)
    if syntax.owned_directory(path, "the role owns") is None:
        assert path not in syntax.SYSTEM_DIRECTORIES
        assert not any(system.startswith(path + "/") for system in syntax.SYSTEM_DIRECTORIES)


@pytest.mark.parametrize("name", ["root", "daemon", "bin", "nobody", "www-data", "_apt", "systemd-network", "adm"])
def test_system_accounts_are_refused(name):
    assert syntax.account_name(name) is not None


@settings(max_examples=300, deadline=None)
@given(texts)
def test_an_accepted_account_name_is_portable(name):
    if syntax.account_name(name) is None:
        assert name.isascii() and name[0] not in "-0123456789" and len(name) <= 32
        assert shlex.split(name) == [name] and fits_a_unit_line(name)


@pytest.mark.parametrize(
    ("value", "low", "high", "whole", "expected"),
    [
        ("8", 1, None, True, (8, None)),
        (" 8 ", 1, None, True, (8, None)),
        ("eighty", 1, None, True, (None, syntax.Refusal("not a whole number", "write a whole number at least 1"))),
        ("1e3", 1, None, True, (None, syntax.Refusal("not a whole number", "write a whole number at least 1"))),
        (True, 0, 1, True, (None, syntax.Refusal("not a whole number", "write a whole number from 0 to 1"))),
        (0, 1, None, True, (None, syntax.Refusal("outside its range", "set it at least 1"))),
        ("2.5", 0, None, False, (2.5, None)),
        ("nan", 0, None, False, (None, syntax.Refusal("not a finite number", "write a finite number at least 0"))),
        (8.0, 1, None, True, (8, None)),
        ([8], 1, None, True, (None, syntax.Refusal("not a whole number", "write a whole number at least 1"))),
    ],
)
def test_numbers_from_strings_and_their_bounds(value, low, high, whole, expected):
    assert syntax.number(value, low, high, whole) == expected


@settings(max_examples=300, deadline=None)
@given(st.one_of(texts, st.integers(), st.floats(), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)))
def test_a_number_rule_never_raises(value):
    found, refusal = syntax.number(value, 0, 100)
    assert (found is None) != (refusal is None)


def test_say_names_host_variable_value_and_fix_and_hides_secrets():
    refusal = syntax.Refusal("not a thing", "write a thing")
    assert syntax.say("h", "v", "x", refusal) == "h: v: is 'x', not a thing; fix: write a thing."
    assert "s3cret" not in syntax.say("h", "key", "s3cret", refusal, secret=True)
