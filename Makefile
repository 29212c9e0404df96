# The commands a newcomer needs. Everything runs as root on a Debian 12 machine (the test hosts are
# systemd-nspawn containers and qemu VMs that the harness creates on this machine).
PYTHON      ?= python3
VENV        := .venv
CACHE       := /var/cache/dglkit
WHEELHOUSE  := $(CACHE)/wheelhouse
CLUSTER     := tests/cluster/testcluster.py
DEMO        := demo
DEMO_INV    := /var/lib/dglkit-testcluster/$(DEMO)/inventory
APT_PACKAGES := debootstrap python3-venv systemd-container qemu-system-x86 qemu-utils dpkg-dev iproute2 openssh-client rsync nftables

.PHONY: deps setup test test-unit test-e2e test-vm demo demo-down lint

deps:  ## Debian packages the harness needs on this machine
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES)

# The wheelhouse (and the test hosts' root and apt repository) come from `stage`, which is cached.
$(VENV)/.complete: app/requirements/node.txt app/requirements/ogb.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --no-index --find-links $(WHEELHOUSE) -r app/requirements/node.txt
	$(VENV)/bin/pip install -q --no-index --no-deps --find-links $(WHEELHOUSE) -r app/requirements/ogb.txt
	$(VENV)/bin/pip install -q -r requirements-dev.txt
	$(VENV)/bin/pip install -q --no-deps -e app
	touch $@

# A fresh machine lacks the harness's tools (debootstrap first): install them once, then whenever missing.
$(CACHE)/.deps:
	$(MAKE) --no-print-directory deps
	mkdir -p $(CACHE) && touch $@

setup: $(CACHE)/.deps  ## wheelhouse, test-host root, local apt repository, then the controller venv
	$(PYTHON) $(CLUSTER) stage
	$(PYTHON) tests/vm/vmlab.py image
	$(MAKE) --no-print-directory $(VENV)/.complete

# On two pytest-xdist workers: tests/conftest.py says which tests share one (a cluster, the VM lab) and in what order.
test: setup  ## the suite CI runs: unit, kit, multi-host end-to-end, VM tier without its longest tests
	$(VENV)/bin/pytest -n 2 --no-loadscope-reorder --durations=40 -m 'not vm_long' tests/unit tests/kit tests/e2e tests/vm

test-unit: setup
	$(VENV)/bin/pytest tests/unit tests/kit

test-e2e: setup
	$(VENV)/bin/pytest -m e2e tests/e2e

test-vm: setup  ## the whole VM tier, its longest tests included (needs the e2e tier's venv seed)
	$(VENV)/bin/pytest -m vm tests/vm

lint: setup
	$(VENV)/bin/ansible-lint

demo: setup  ## a 3-host local cluster (storage + 2 workers), site.yml, then a training job
	$(PYTHON) $(CLUSTER) up --name $(DEMO) --hosts 3
	$(VENV)/bin/ansible-playbook -i $(DEMO_INV) site.yml
	$(VENV)/bin/ansible-playbook -i $(DEMO_INV) playbooks/train.yml

demo-down:
	$(PYTHON) $(CLUSTER) down --name $(DEMO)
