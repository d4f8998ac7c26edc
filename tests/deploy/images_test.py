#!/usr/bin/env python3
"""deploy/Dockerfile and deploy/Dockerfile.cuda in step with the build
(ctest deploy.images). No container engine runs here, so the images are never
built; this checks what they name: each is a multi-stage build (a build stage,
then a runtime stage that copies the binaries from it); the files and folders
they copy exist; the scripts they run exist and are executable; the binaries
they copy are ones the build makes; CONVEYOR_TORCH and the CMake option they
set are ones scripts/ and CMakeLists.txt know; the Debian packages they name
exist (scripts/setup.sh lists them, or apt knows them); the program they run
answers --help; scripts/runtime-packages.sh finds a package for every library
the binaries built here load, so the runtime stage installs all of them.

    tests/deploy/images_test.py SOURCE_DIR BIN_DIR
"""
import os
import re
import subprocess
import sys

from deploy_checks import check, finish


def instructions(path):
    """(INSTRUCTION, arguments) with continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in open(path):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        cur += " " + s[:-1] if s.endswith("\\") else " " + s
        if not s.endswith("\\"):
            word, _, rest = cur.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            cur = ""
    return out


def setup_packages(src):
    text = open(os.path.join(src, "scripts/setup.sh")).read()
    words = set()
    for block in re.findall(r"packages(?:\+)?=\(([^)]*)\)", text):
        words |= set(block.split())
    return words


def apt_knows(package):
    return subprocess.run(["apt-cache", "show", package], capture_output=True).returncode == 0


def check_dockerfile(src, bin_dir, name, torch):
    path = os.path.join(src, "deploy", name)
    steps = instructions(path)
    froms = [(i, a) for i, (w, a) in enumerate(steps) if w == "FROM"]
    check(len(froms) == 2, f"{name}: {len(froms)} stages, expected a build stage and a runtime stage")
    check(froms[0][1].endswith(" AS build"), f"{name}: the first stage is not `AS build`")
    check(" AS " not in froms[-1][1], f"{name}: the last stage (the image) is named")
    check(os.path.exists(path + ".dockerignore"), f"{name}: no {name}.dockerignore (BuildKit reads it)")
    build_runs = " ".join(a for i, (w, a) in enumerate(steps) if w == "RUN" and i < froms[-1][0])
    runtime_runs = " ".join(a for i, (w, a) in enumerate(steps) if w == "RUN" and i > froms[-1][0])
    env = " ".join(a for w, a in steps if w == "ENV")
    check(f"CONVEYOR_TORCH={torch}" in env, f"{name}: does not set CONVEYOR_TORCH={torch} (scripts/torch-source.sh)")
    for script in set(re.findall(r"scripts/[\w.-]+", build_runs + runtime_runs)):
        check(os.access(os.path.join(src, script), os.X_OK), f"{name}: runs {script}, which is not an executable script")
    check("scripts/setup.sh" in build_runs and "scripts/build.sh" in build_runs,
          f"{name}: the build stage does not run scripts/setup.sh and scripts/build.sh")
    for option in re.findall(r"-D(\w+)=", build_runs):
        check(re.search(r"option\(\s*" + option + r"\b", open(os.path.join(src, "CMakeLists.txt")).read()) is not None,
              f"{name}: CMakeLists.txt has no option {option}")
    build_dir = re.search(r"BUILD_DIR=(\S+)", build_runs)
    if check(build_dir is not None, f"{name}: the build stage sets no BUILD_DIR"):
        build_dir = build_dir.group(1)
    for w, a in steps:
        if w != "COPY":
            continue
        words = a.split()
        if words[0].startswith("--from="):
            for source in words[1:-1]:
                if check(source.startswith(f"{build_dir}/bin/") or source.startswith("/tmp/runtime-packages"),
                         f"{name}: copies {source} from the build stage, which the build does not make"):
                    if source.startswith(f"{build_dir}/bin/"):
                        binary = source[len(build_dir) + 5:]
                        check(os.access(os.path.join(bin_dir, binary), os.X_OK), f"{name}: {binary} is not built")
        else:
            for source in words[:-1]:
                check(source == "." or os.path.exists(os.path.join(src, source)), f"{name}: copies {source}, not in the repository")
    check("runtime-packages.txt" in runtime_runs, f"{name}: the runtime stage does not install scripts/runtime-packages.sh's list")
    named = set()
    for install in re.findall(r"apt-get install ([^&;]*)", runtime_runs):
        named |= {w for w in re.sub(r"\$\([^)]*\)", "", install).split() if not w.startswith(("-", "$"))}
    for package in named:
        check(package in setup_packages(src) or apt_knows(package),
              f"{name}: installs {package}, which neither scripts/setup.sh lists nor apt knows")
    cmd = [w for w, a in steps if w == "CMD"]
    program = re.search(r'\["(\w+)"', [a for w, a in steps if w == "CMD"][-1]).group(1) if cmd else None
    if check(program is not None, f"{name}: no CMD"):
        check(subprocess.run([os.path.join(bin_dir, program), "--help"], capture_output=True).returncode == 0,
              f"{name}: CMD {program} --help fails")
    uid = re.search(r"--uid (\d+)", runtime_runs)
    return uid.group(1) if uid else None


def main():
    src, bin_dir = sys.argv[1], sys.argv[2]
    uids = {check_dockerfile(src, bin_dir, "Dockerfile", "debian"), check_dockerfile(src, bin_dir, "Dockerfile.cuda", "pip")}
    check(len(uids) == 1 and None not in uids, f"the images run as different users: {uids}")
    binaries = [os.path.join(bin_dir, b) for b in ("stage_server", "coordinator", "conveyor")]
    r = subprocess.run([os.path.join(src, "scripts/runtime-packages.sh")] + binaries, capture_output=True, text=True)
    packages = r.stdout.split()
    check(r.returncode == 0 and packages, f"scripts/runtime-packages.sh failed: {r.stderr}")
    check(r.stderr == "", f"libraries the image would lack: {r.stderr}")
    q = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n"] + packages, capture_output=True, text=True)
    installed = {line.split()[0] for line in q.stdout.splitlines() if line.endswith("install ok installed")}
    check(set(packages) <= installed, f"runtime packages not installed here: {sorted(set(packages) - installed)}")
    for must in ("libgrpc++", "libprotobuf", "libyaml-cpp", "libsqlite3", "libspdlog"):
        check(any(p.startswith(must) for p in packages), f"scripts/runtime-packages.sh found no {must}* package")
    return finish(f"both Dockerfiles; the runtime stage installs {len(packages)} packages for the binaries' libraries")


if __name__ == "__main__":
    sys.exit(main())
