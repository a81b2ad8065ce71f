terraform {
  # A pure module: locals, templatefile and outputs, no provider and no resource.
  required_version = ">= 1.6.0"
}
