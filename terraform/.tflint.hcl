# tflint configuration for every module under terraform/ (scripts/terraform-check.sh).
# The terraform ruleset is bundled with tflint: nothing to download, no `tflint --init`.
config {
  # Local modules (../modules/...) are evaluated with their callers; remote ones are not fetched.
  call_module_type = "local"
}

plugin "terraform" {
  enabled = true
  preset  = "recommended"
}
