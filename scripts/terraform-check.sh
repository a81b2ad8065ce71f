#!/usr/bin/env bash
# Checks the Terraform code under terraform/ offline, with the pinned tools of `make hashistack`:
#   1. tofu fmt -check on terraform/ and internal/tofutest/testdata;
#   2. tflint (bundled terraform ruleset, preset "recommended", terraform/.tflint.hcl) in every
#      directory under terraform/ holding *.tf files (.terraform and testdata directories skipped);
#   3. tofu test in every module under terraform/modules/ that has *.tftest.hcl files.
# Modules using the aws or google providers get 1 and 2 only: their providers cannot be installed
# here, so they are never init'ed or validated.
# OASIS_TOFU_BIN / OASIS_TFLINT_BIN override bin/tofu and bin/tflint.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tofu=${OASIS_TOFU_BIN:-$root/bin/tofu}
tflint=${OASIS_TFLINT_BIN:-$root/bin/tflint}
for b in "$tofu" "$tflint"; do
	if [ ! -x "$b" ]; then
		echo "terraform-check: $b not found (run make hashistack)" >&2
		exit 1
	fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# An empty CLI configuration: no registry credentials, no plugin cache, no provider installation
# from anywhere (this environment points TF_CLI_CONFIG_FILE at a missing file).
: >"$work/tofurc"
export TF_CLI_CONFIG_FILE="$work/tofurc" TF_IN_AUTOMATION=1 TF_INPUT=0 CHECKPOINT_DISABLE=1

fmt_dirs=(terraform)
[ -d internal/tofutest/testdata ] && fmt_dirs+=(internal/tofutest/testdata)
echo "terraform-check: tofu fmt -check ${fmt_dirs[*]}"
if ! "$tofu" fmt -check -recursive -diff "${fmt_dirs[@]}"; then
	echo "terraform-check: run bin/tofu fmt -recursive ${fmt_dirs[*]}" >&2
	exit 1
fi

# Test fixtures (testdata/) are formatted but not linted: they are minimal modules for tests.
mapfile -t dirs < <(find terraform \( -name .terraform -o -name testdata \) -prune -o -type f -name '*.tf' -printf '%h\n' | sort -u)
for d in "${dirs[@]}"; do
	echo "terraform-check: tflint $d"
	"$tflint" --config "$root/terraform/.tflint.hcl" --chdir "$d" --format compact
done

mapfile -t tested < <(find terraform/modules -name .terraform -prune -o -type f -name '*.tftest.hcl' -printf '%h\n' 2>/dev/null |
	sed 's#/tests$##' | sort -u)
for d in "${tested[@]}"; do
	echo "terraform-check: tofu test $d"
	data="$work/$(echo "$d" | tr / _)"
	(cd "$d" && TF_DATA_DIR="$data" "$tofu" init -no-color -backend=false >/dev/null &&
		TF_DATA_DIR="$data" "$tofu" test -no-color)
done
echo "terraform-check: ok (${#dirs[@]} directories linted, ${#tested[@]} modules tested)"
