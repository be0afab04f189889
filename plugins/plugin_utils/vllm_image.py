"""The fleet's own vLLM image (container mode): what it is built from, its name, and which images a host
may remove.

The image is built once per build class on that class's builder (roles/vllm_image) from files on the controller:

* the base: a Debian suite (vllm_image_suite) from the distribution archive, debootstrap + podman import, as
  the repository's test harness makes its images; never a registry's image;
* the vLLM wheel: the build role's (vllm_install_source: wheel, <wheel store>/<class>/vllm-<version>.json names it)
  or the prebuilt one of the wheelhouse (index);
* the dependencies: the wheelhouse scripts/wheelhouse.sh filled for the suite's Python (<wheelhouse>/<cpXY>/), the
  exact pins of its manifest, installed with pip --no-index --no-deps as roles/vllm_install installs a venv.

Its name is ``<registry>/vllm-cpu-fleet/vllm:<version>-<build class>-<inputs key>``, the key 16 hex of a digest of
every input: another wheel, another dependency set, another suite or another recipe (RECIPE) is another image, and
the same inputs give the same name on every host and every run, so a host finds the image it needs without asking
the builder. ``image_plan`` works that out (and says every problem in the house's words); ``prune_decision`` says
which of a host's images may go (never one a unit, a container or a rollout snapshot names).

Pure Python (the standard library and the collection's module_utils): the filters of plugins/filter/vllm_image.py
and preflight's container section (preflight/container.py) call it, on the controller.
"""

import datetime
import hashlib
import json
import os
import re

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_common import public_version_key, read_json
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_container import DEFAULTS as UNIT_DEFAULTS
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_container import (
    PUBLIC_REGISTRIES,
    image_reference,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_wheel import (
    SHA256_HEX,
    garbled_pins,
    hashed_requirements,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_syntax import Refusal, say
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_wheelhouse import wheelhouse_command

# The image's repository under the inventory's registry, and the base images' (built on the builder, never pushed).
REPOSITORY = "vllm-cpu-fleet/vllm"
BASE_REPOSITORY = "localhost/vllm-cpu-fleet/debian"
# Where the image holds vLLM's venv (the unit's Exec= names its programs without it: the image's PATH starts there).
IMAGE_VENV = UNIT_DEFAULTS["image_venv"]
# The revision of how the image is made: roles/vllm_image/templates/Containerfile.j2 and files/base_image.sh. Bump it
# with any change to them (tests/unit/test_image.py pins their digests to it): another recipe is another image.
RECIPE = 4
# The Debian suites a base image is made from: their Python (the wheelhouse's python tag) and glibc.
SUITES = {
    "bookworm": {"debian": "12", "python_version": "3.11", "python_tag": "cp311", "glibc": "2.36"},
    "trixie": {"debian": "13", "python_version": "3.13", "python_tag": "cp313", "glibc": "2.41"},
}
# What the base image holds besides debootstrap's minbase: the venv's Python, libnuma (vLLM's NUMA binding links
# the system's libnuma.so.1), tcmalloc (the plan preloads it), and the C++ compiler with Python's headers that torch
# inductor compiles the model with at warm-up (without g++ the worker dies with InvalidCxxCompiler; a venv host has
# them from the toolchain role's runtime packages). No shell tools beyond minbase.
BASE_PACKAGES = {
    "bookworm": (
        "python3",
        "python3-venv",
        "python3-dev",
        "g++",
        "libnuma1",
        "libtcmalloc-minimal4",
        "ca-certificates",
    ),
    "trixie": (
        "python3",
        "python3-venv",
        "python3-dev",
        "g++",
        "libnuma1",
        "libtcmalloc-minimal4t64",
        "ca-certificates",
    ),
}
MULTIARCH = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
TRANSFERS = ("archive", "registry")
# A tag's characters (github.com/distribution/reference): a build class name may hold more (+).
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_TAG = re.compile(r"^(?P<version>[^-]+)-(?P<rest>.+)-(?P<key>[0-9a-f]{16})\Z")


def base_period(day, refresh_days):
    """The first day (YYYYMMDD, UTC) of the refresh period that ``day`` (days since 1970-01-01) falls in, or ""
    when bases are never refreshed (refresh_days 0): the base is made anew, with the archive's updates and
    security fixes of that day, once per period."""
    refresh_days = int(refresh_days)
    if refresh_days <= 0:
        return ""
    start = int(day) - int(day) % refresh_days
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=start)).strftime("%Y%m%d")


def base_image(suite, period=""):
    """The base image's local name for ``suite``: another recipe, or another refresh period, is another base."""
    return f"{BASE_REPOSITORY}:{suite}-r{RECIPE}" + (f"-{period}" if period else "")


def repository(registry):
    """``<registry>/vllm-cpu-fleet/vllm``: every image of the fleet, whatever its tag."""
    return f"{registry}/{REPOSITORY}"


def inputs_key(inputs):
    """16 hex of sha256 over the inputs (sorted JSON): the tag's last part."""
    text = json.dumps({"format": 1, "inputs": inputs}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def registry_problems(host, registry, transfer, allowed=()):
    """The inventory's registry and transfer, as the image's name and the hosts' pull need them. A registry other
    than localhost must be one the inventory allows (vllm_image_registries_allowed): an allow-list, since no list
    of public registries is ever complete (mirror.gcr.io, a cloud's own)."""
    problems = []
    if transfer not in TRANSFERS:
        problems.append(
            say(
                host,
                "vllm_image_transfer",
                transfer,
                Refusal("not a way to get the image to the hosts", "archive or registry"),
            )
        )

    def refused(why, fix):
        return [*problems, say(host, "vllm_image_registry", registry, Refusal(why, fix))]

    if not isinstance(registry, str) or not registry:
        return refused("empty", "localhost, or the registry's host[:port]")
    if registry.split(":", 1)[0].lower() in PUBLIC_REGISTRIES:
        return refused(
            "a public registry, and the fleet serves only the image its builder made (nothing is pulled from or pushed"
            " to a public registry)",
            "name the inventory's own registry, or keep localhost with vllm_image_transfer: archive",
        )
    if image_reference(f"{registry}/{REPOSITORY}:0.0.0-class-0000000000000000"):
        return refused(
            "not a registry host (localhost, or a DNS name or address with an optional :port)",
            "write it as podman names it, such as registry.example:5000",
        )
    if registry.split(":", 1)[0] != "localhost" and registry.lower() not in {
        str(item).lower() for item in allowed or () if isinstance(item, str)
    }:
        return refused(
            "not in vllm_image_registries_allowed, the registries this inventory trusts with its images",
            f"add {registry!r} to vllm_image_registries_allowed if it is your own registry, or keep localhost with"
            " vllm_image_transfer: archive",
        )
    if transfer == "registry" and registry.split(":", 1)[0] == "localhost":
        return refused(
            "localhost, which is no registry the hosts can pull from (vllm_image_transfer: registry)",
            "name the inventory's registry, or set vllm_image_transfer: archive (podman save, copy, load)",
        )
    return problems


def _wheelhouse(host, version, arch, suite, options, plan, problems):
    """The suite's wheelhouse manifest and what it lists; fills plan."""
    facts = SUITES[suite]
    wheelhouse = options["wheelhouse"]
    manifest_path = os.path.join(wheelhouse, facts["python_tag"], f"vllm-{version}.json")
    fill = wheelhouse_command(wheelhouse, "--vllm", version, "--python", facts["python_version"])
    if options["source"] == "index":
        fill = wheelhouse_command(
            wheelhouse, "--dist", options["package"], "--vllm", version, "--python", facts["python_version"]
        )
    if not os.path.isfile(manifest_path):
        problems.append(
            f"{host}: vllm_image_suite: is {suite}, whose Python is {facts['python_version']}, and the wheelhouse"
            f" {wheelhouse} has no vLLM {version} for {facts['python_tag']} ({manifest_path} is missing); fix: fill it"
            f" on the controller ({fill}), or set vllm_image_suite to the suite of a Python the wheelhouse holds."
        )
        return None
    manifest = read_json(manifest_path)
    misfits = []
    if manifest.get("arch") != arch:
        misfits.append(f"it is for {manifest.get('arch')}, this class is {arch}")
    if options["source"] == "index" and manifest.get("vllm_dist") != options["package"]:
        misfits.append(f"it holds {manifest.get('vllm_dist')}, not vllm_install_package={options['package']}")
    needed = re.sub(r"^manylinux_(\d+)_(\d+)_.*$", r"\1.\2", str(manifest.get("platform", "")))
    if re.fullmatch(r"\d+\.\d+", needed) and tuple(map(int, needed.split("."))) > tuple(
        map(int, facts["glibc"].split("."))
    ):
        misfits.append(f"its wheels need glibc {needed}, {suite} has {facts['glibc']}")
    garbled = garbled_pins(manifest, options["source"] == "index")
    if garbled:
        misfits.append(f"entries a hash-checked install cannot use ({'; '.join(garbled[:3])})")
    if misfits:
        problems.append(
            f"{host}: the wheelhouse manifest {manifest_path} does not fit the image: {'; '.join(misfits)}; fix:"
            f" fill it again ({fill})."
        )
        return None
    directory = os.path.dirname(manifest_path)
    bundle = os.path.join(directory, f"vllm-{version}-deps.tar")
    missing = [bundle] if not os.path.isfile(bundle) else []
    if options["source"] == "index":
        wheel = os.path.join(directory, str(manifest.get("vllm_wheel", "")))
        if not manifest.get("vllm_wheel") or not os.path.isfile(wheel):
            missing.append(wheel)
        else:
            plan.update(wheel=wheel, wheel_sha256=manifest.get("vllm_wheel_sha256"))
    if missing:
        problems.append(f"{host}: the wheelhouse misses {', '.join(missing)}; fix: run {fill} again.")
        return None
    plan.update(
        wheelhouse_manifest=manifest_path,
        deps_bundle=bundle,
        requirements=hashed_requirements(manifest),
    )
    return manifest


def _built_wheel(host, version, build_class, options, plan, problems):
    """The build role's wheel of this class on the controller (its manifest names it); fills plan."""
    store = options["wheel_store"]
    manifest_path = os.path.join(store, build_class, f"vllm-{version}.json")
    if not os.path.isfile(manifest_path):
        if not options.get("wheel_pending"):
            problems.append(
                f"{host}: vllm_install_source: is wheel, and the controller has no wheel of vLLM {version} for build"
                f" class {build_class} ({manifest_path} is missing); fix: build it (site.yml and playbooks/upgrade.yml"
                " build it first; roles/vllm_build), or use vllm_install_source: index."
            )
        plan["pending"] = True
        return
    manifest = read_json(manifest_path)
    wheel = os.path.join(store, build_class, str(manifest.get("wheel", "")))
    if not manifest.get("wheel") or not os.path.isfile(wheel):
        problems.append(
            f"{host}: {manifest_path} names the wheel {wheel}, which is not on the controller; fix: re-run the build"
            " (vllm_build_force: true) for this class."
        )
        return
    if not SHA256_HEX.fullmatch(str(manifest.get("sha256", ""))):
        problems.append(
            f"{host}: {manifest_path} gives the wheel's sha256 as {manifest.get('sha256')!r}, not 64 hex digits; the"
            " image's install checks the wheel against it. Fix: re-run the build (vllm_build_force: true) for this"
            " class."
        )
        return
    plan.update(wheel=wheel, wheel_sha256=manifest.get("sha256"), wheel_inputs_key=manifest.get("inputs_key"))


def image_plan(version, build_class, arch, options, host=""):
    """What the image of (``version``, ``build_class``) is built from and named: (plan, problems).

    ``options``: registry, transfer, source (vllm_install_source), package (vllm_install_package), suite,
    wheelhouse, wheel_store (the build role's artifact store), image_store (where archives go on the controller)
    and wheel_pending (true while the run has still to build the wheel: its name is then unknown, ``pending``).
    The plan: reference, repository, tag, registry, transfer, inputs, inputs_key, suite, python_version, python_tag,
    base, packages, wheel, wheel_sha256, deps_bundle, wheelhouse_manifest, requirements, archive, manifest, venv,
    tcmalloc, iomp, distribution, pending. Every problem is one line naming the variable and the fix.
    """
    problems = []
    allowed = options.get("registries_allowed") or ()
    suite = options.get("suite")
    refresh = options.get("base_refresh_days", 0)
    try:
        period = base_period(options.get("base_day", 0), refresh)
    except (TypeError, ValueError, OverflowError):
        period = ""
        problems.append(
            say(
                host,
                "vllm_image_base_refresh_days",
                refresh,
                Refusal("not a whole number of days", "7 (a new base each week), or 0 (never: one per recipe)"),
            )
        )
    if suite not in SUITES:
        problems.append(
            say(
                host,
                "vllm_image_suite",
                suite,
                Refusal("not a Debian suite the image is made from", f"one of {', '.join(sorted(SUITES))}"),
            )
        )
    if arch not in MULTIARCH:
        problems.append(
            say(host, "vllm_plan.arch", arch, Refusal("not an architecture of the image", "x86_64 or aarch64"))
        )
    if options.get("source") not in ("index", "wheel"):
        problems.append(
            say(host, "vllm_install_source", options.get("source"), Refusal("not a source", "index or wheel"))
        )
    if not isinstance(build_class, str) or not build_class or not isinstance(version, str) or not version:
        problems.append(
            say(
                host,
                "vllm_plan.build.build_class",
                build_class,
                Refusal("no build class or version", "plan the host first"),
            )
        )
    if problems:
        return None, [*registry_problems(host, options.get("registry"), options.get("transfer"), allowed), *problems]
    # The registry's problems and the files', all at once: the name waits for both.
    problems = registry_problems(host, options.get("registry"), options.get("transfer"), allowed)
    facts = SUITES[suite]
    distribution = "vllm" if options["source"] == "wheel" else options["package"]
    plan = {
        "registry": options["registry"],
        "transfer": options["transfer"],
        "repository": repository(options["registry"]) if not problems else None,
        "suite": suite,
        "python_version": facts["python_version"],
        "python_tag": facts["python_tag"],
        "base": base_image(suite, period),
        "packages": list(BASE_PACKAGES[suite]),
        "venv": IMAGE_VENV,
        "tcmalloc": f"/usr/lib/{MULTIARCH[arch]}/libtcmalloc_minimal.so.4",
        "iomp": f"{IMAGE_VENV}/lib/libiomp5.so",
        "distribution": distribution,
        "pending": False,
        "wheel": None,
        "wheel_sha256": None,
        "reference": None,
        "tag": None,
        "inputs_key": None,
    }
    manifest = _wheelhouse(host, version, arch, suite, options, plan, problems)
    if options["source"] == "wheel":
        _built_wheel(host, version, build_class, options, plan, problems)
    plan["inputs"] = {
        "recipe": RECIPE,
        "version": version,
        "build_class": build_class,
        "arch": arch,
        "suite": suite,
        "python": facts["python_version"],
        "source": options["source"],
        "distribution": distribution,
        "wheel": os.path.basename(plan["wheel"]) if plan["wheel"] else None,
        "wheel_sha256": plan["wheel_sha256"],
        "deps": (manifest or {}).get("inputs_key"),
        "torch": (manifest or {}).get("torch_wheel"),
        # The base's name carries its refresh period: a new period is a new base (that day's security fixes), so a
        # new image for every host, rolled out as any other.
        "base": plan["base"],
    }
    if problems or plan["pending"]:
        return plan, problems
    key = inputs_key(plan["inputs"])
    tag = f"{version}-{_TAG_UNSAFE.sub('_', build_class)}-{key}"
    reference = f"{plan['repository']}:{tag}"
    refusal = image_reference(reference)
    if refusal:
        return plan, [say(host, "the image's name", reference, refusal)]
    directory = os.path.join(options["image_store"], build_class)
    plan.update(
        inputs_key=key,
        tag=tag,
        reference=reference,
        archive=os.path.join(directory, f"vllm-image-{tag}.tar"),
        manifest=os.path.join(directory, f"vllm-image-{tag}.json"),
    )
    return plan, []


# ------------------------------------------------------------------------------------------------ prune


def image_version(reference, repository_name):
    """The vLLM version a reference of the fleet's repository carries in its tag, or None (not ours)."""
    prefix = f"{repository_name}:"
    if not isinstance(reference, str) or not reference.startswith(prefix):
        return None
    found = _TAG.match(reference[len(prefix) :])
    return found["version"] if found else None


def prune_decision(images, repository_name, protected, keep):
    """Which of a host's images of the fleet's repository may go: {"remove": [...], "keep": [...]}, each
    {"reference", "reason"}.

    ``images``: ``podman images --format json`` (each with Names and Created); ``protected``: {reference: why} of
    every image a unit file, a container or a rollout snapshot or record names; ``keep``: how many images the host
    keeps (vllm_image_keep, at least 1), the protected ones first, then the newest by version and creation. Nothing
    is removed while no unit names an image (a host that serves none): there is no active one to keep.
    """
    found = {}
    for image in images or []:
        for name in image.get("Names") or []:
            if image_version(name, repository_name) is not None:
                found.setdefault(name, int(image.get("Created") or 0))
    if not found:
        return {"remove": [], "keep": []}
    if not protected:
        return {
            "remove": [],
            "keep": [
                {"reference": name, "reason": "no unit, container or snapshot names an image: nothing is pruned"}
                for name in sorted(found)
            ],
        }
    keep = max(1, int(keep))

    def order(name):
        return (public_version_key(image_version(name, repository_name)) or (), found[name])

    kept, removed = keep_newest(found, order, protected, keep, f"one of the newest {keep} (vllm_image_keep)")
    return {
        "remove": [{"reference": name, "reason": why} for name, why in removed],
        "keep": [{"reference": name, "reason": why} for name, why in kept],
    }


def keep_newest(names, order, protected, keep, newest_reason):
    """([(name, why)] kept, [(name, why)] removed) of ``names``: every protected one ({name: why}) first, then the
    newest by ``order`` up to ``keep`` in all; the rest go. The one rule of the hosts' and the stores' prunes."""
    ranked = sorted(names, key=order, reverse=True)
    kept = [(name, protected[name]) for name in ranked if name in protected]
    removed = []
    for name in ranked:
        if name in protected:
            continue
        if len(kept) < keep:
            kept.append((name, newest_reason))
        else:
            removed.append((name, f"older than the {keep} images kept (vllm_image_keep)"))
    return kept, removed


# The controller's store (<vllm_image_store>/<build class>/) and a builder's work root (<vllm_image_work_root>/<tag>/)
# hold each image as vllm-image-<tag>.tar (and the store its .json manifest).
_STORE_FILE = re.compile(r"^vllm-image-(?P<tag>.+)\.(?:tar|json)\Z")


def store_prune_decision(files, protected_tags, keep):
    """Which of the image archives and manifests on the controller or a builder may go: {"remove": [...], "keep":
    [...]}, each {"path", "tag", "reason"}.

    ``files``: the find module's files ({path, mtime}); ``protected_tags``: {tag: why} of the images this run's hosts
    run or are given; ``keep``: how many images of each build class stay (vllm_image_keep, at least 1), the protected
    ones first, then the newest by version and time. A file whose name is no image's is left alone. Nothing goes
    while nothing is protected (a run that planned no container host cannot tell what is in use)."""
    tags = {}
    for entry in files or []:
        path = str(entry.get("path", ""))
        named = _STORE_FILE.match(os.path.basename(path))
        found = _TAG.match(named["tag"]) if named else None
        if not found:
            continue
        tag = named["tag"]
        seen = tags.setdefault(tag, {"version": found["version"], "class": found["rest"], "mtime": 0.0, "paths": []})
        seen["paths"].append(path)
        seen["mtime"] = max(seen["mtime"], float(entry.get("mtime") or 0))
    if not tags or not protected_tags:
        why = "nothing this run plans names an image: nothing is pruned"
        return {"remove": [], "keep": [{"path": p, "tag": t, "reason": why} for t in sorted(tags)
                                       for p in sorted(tags[t]["paths"])]}
    keep = max(1, int(keep))

    def order(tag):
        return (public_version_key(tags[tag]["version"]) or (), tags[tag]["mtime"])

    decision = {"remove": [], "keep": []}
    for build_class in sorted({t["class"] for t in tags.values()}):
        kept, removed = keep_newest(
            [t for t in tags if tags[t]["class"] == build_class],
            order,
            protected_tags,
            keep,
            f"one of the newest {keep} of build class {build_class} (vllm_image_keep)",
        )
        for side, chosen in (("keep", kept), ("remove", removed)):
            decision[side] += [
                {"path": path, "tag": tag, "reason": why} for tag, why in chosen for path in sorted(tags[tag]["paths"])
            ]
    return decision
