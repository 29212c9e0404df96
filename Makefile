# The commands a newcomer needs. Everything runs as root on a Debian 12 machine (the test hosts are
# systemd-nspawn containers and qemu VMs that the harness creates on this machine).
PYTHON      ?= python3
VENV        := .venv
CACHE       := /var/cache/dglkit
WHEELHOUSE  := $(CACHE)/wheelhouse
CLUSTER     := tests/cluster/testcluster.py
DEMO        := demo
DEMO_INV    := /var/lib/dglkit-testcluster/$(DEMO)/inventory
APT_PACKAGES := debootstrap python3-venv systemd-container qemu-system-x86 qemu-utils dpkg-dev iproute2 openssh-client rsync nftables \
	ptscotch libptscotch-dev openmpi-bin

LOCK        := app/requirements/node.lock
UV          ?= $(VENV)/bin/uv
# The node environment as PyPI had it when dgl 2.1.0 came out (2024-03-05), the versions DGL's examples and CI
# ran with. The newest instead: certifi, idna, requests, urllib3 (network and TLS: security fixes), psutil (the
# launcher needs 6), packaging (pytest needs >= 24 in the controller venv) and mpi4py (the distributed partitioner;
# its Linux wheels came later). One resolution for Python 3.10-3.12.
LOCK_FLAGS  := --universal --python-version 3.10 --exclude-newer 2024-03-06 \
	$(foreach p,certifi idna requests urllib3 psutil packaging mpi4py,--exclude-newer-package $(p)=false) \
	--excludes app/requirements/node-excluded.txt --generate-hashes --custom-compile-command 'make lock'

.PHONY: deps setup test test-fast test-unit test-e2e test-vm demo demo-down lint lock settings docs collection

deps:  ## Debian packages the harness needs on this machine
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES)

# The wheelhouse (and the test hosts' root and apt repository) come from `stage`, which is cached.
$(VENV)/.complete: $(LOCK) requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --no-index --find-links $(WHEELHOUSE) --require-hashes --no-deps -r $(LOCK)
	$(VENV)/bin/pip install -q -r requirements-dev.txt
	$(VENV)/bin/pip install -q --no-deps -e app
	touch $@

# A fresh machine lacks the harness's tools (debootstrap first): install them once, then whenever missing.
$(CACHE)/.deps:
	$(MAKE) --no-print-directory deps
	mkdir -p $(CACHE) && touch $@

setup: $(CACHE)/.deps  ## wheelhouse, test-host root, local apt repository, then the controller venv
	$(PYTHON) $(CLUSTER) stage
	$(PYTHON) -m tests.vm.vmlab image
	$(MAKE) --no-print-directory $(VENV)/.complete

# On two pytest-xdist workers: tests/conftest.py says which tests share one (a cluster, the VM lab) and in what order.
test: setup  ## the suite CI runs: unit, kit, multi-host end-to-end, VM tier without its longest tests
	$(VENV)/bin/pytest -n 2 --no-loadscope-reorder --durations=40 -m 'not vm_long' tests/unit tests/kit tests/e2e tests/vm

# Everyday work: the unit and kit tiers without their slow tests, no test hosts (about 4 minutes on 2 cores).
test-fast: setup  ## unit and kit tiers without the tests marked slow
	$(VENV)/bin/pytest -n 2 -q -m 'not slow' tests/unit tests/kit

test-unit: setup
	$(VENV)/bin/pytest tests/unit tests/kit

test-e2e: setup
	$(VENV)/bin/pytest -m e2e tests/e2e

test-vm: setup  ## the whole VM tier, its longest tests included (needs the e2e tier's venv seed)
	$(VENV)/bin/pytest -m vm tests/vm

# The commands' modules import dgl and torch: the controller venv's Python.
docs:  ## docs/cli.md, the node CLI's option reference, from the commands' argparse parsers
	PYTHONPATH=app $(VENV)/bin/python -m dglkit clidoc --write

settings:  ## the role defaults, argument specs, sample job.yml and docs/settings.md table from app/dglkit/settings.py
	PYTHONPATH=app $(PYTHON) -m dglkit settings --write

# The repository's root is the collection's root (galaxy.yml says what stays out), built from the committed tree
# (git archive): your own inventories, runs and anything uncommitted stay out. Any ansible-galaxy will do:
# ANSIBLE_GALAXY=ansible-galaxy make collection.
ANSIBLE_GALAXY ?= $(VENV)/bin/ansible-galaxy
collection:  ## dist/dglkit-cluster-<version>.tar.gz, the Ansible collection dglkit.cluster (committed files only)
	rm -rf dist/tree && mkdir -p dist/tree
	git archive HEAD | tar -x -C dist/tree
	$(ANSIBLE_GALAXY) collection build --force --output-path dist dist/tree
	rm -rf dist/tree

# Needs PyPI. The dry runs check that every locked package has a wheel for each supported Python.
lock:  ## app/requirements/node.lock (every package, with hashes) from node.in, after changing node.in
	$(UV) pip compile $(LOCK_FLAGS) -o $(LOCK) app/requirements/node.in
	target=$$(mktemp -d); status=0; for v in 3.10 3.11 3.12; do $(UV) pip install -q --dry-run --require-hashes \
	  --no-deps --no-build --python-platform x86_64-manylinux_2_28 --python-version $$v --target $$target \
	  -r $(LOCK) || { status=1; break; }; done; rm -rf $$target; exit $$status

# The suite runs the same checks (tests/kit/test_lint.py); ruff and mypy read pyproject.toml.
lint: setup  ## ansible-lint, ruff on every Python file, mypy on app/
	$(VENV)/bin/ansible-lint
	$(VENV)/bin/ruff check
	$(VENV)/bin/mypy

demo: setup  ## a 3-host local cluster (storage + 2 workers), site.yml, then a training job
	$(PYTHON) $(CLUSTER) up --name $(DEMO) --hosts 3
	$(VENV)/bin/ansible-playbook -i $(DEMO_INV) site.yml
	$(VENV)/bin/ansible-playbook -i $(DEMO_INV) playbooks/train.yml

demo-down:
	$(PYTHON) $(CLUSTER) down --name $(DEMO)
