locals {
  kvcached = var.kvcached_volume_size_gb > 0
  tags     = merge({ "oasis-role" = "gpu-node", "nomad-role" = "client", "consul-role" = "client" }, var.tags)
}

module "node" {
  source = "../modules/nomad-gpu-client"

  oasis_release_url    = var.oasis_release_url
  oasis_release_sha256 = var.oasis_release_sha256
  nomad_version        = var.nomad_version
  consul_version       = var.consul_version
  region               = var.nomad_region
  datacenter           = var.datacenter
  node_pool            = var.node_pool
  node_class           = var.instance_type
  meta                 = merge({ "oasis.instance_type" = var.instance_type }, var.meta)
  nomad_servers        = var.nomad_servers
  consul_retry_join    = var.consul_retry_join
  llm_engine_binaries  = var.llm_engine_binaries
  kvcached_device      = var.kvcached_device
  consul_agent_token   = var.consul_agent_token
  nomad_consul_token   = var.nomad_consul_token
  consul_gossip_key    = var.consul_gossip_key
}

resource "aws_launch_template" "gpu" {
  name_prefix   = "${var.name}-"
  image_id      = var.ami_id
  instance_type = var.instance_type
  key_name      = var.key_name == "" ? null : var.key_name
  user_data     = module.node.user_data_base64

  vpc_security_group_ids = var.security_group_ids

  dynamic "iam_instance_profile" {
    for_each = var.iam_instance_profile == "" ? [] : [var.iam_instance_profile]
    content {
      name = iam_instance_profile.value
    }
  }

  # IMDSv2 only, and not from containers one hop further: user-data holds the node's secrets
  # when they are given as inputs (README).
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "enabled"
  }

  block_device_mappings {
    device_name = "/dev/sda1"
    ebs {
      volume_size           = var.root_volume_size_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  dynamic "block_device_mappings" {
    for_each = local.kvcached ? [1] : []
    content {
      device_name = "/dev/sdf"
      ebs {
        volume_size           = var.kvcached_volume_size_gb
        volume_type           = "gp3"
        iops                  = var.kvcached_volume_iops
        throughput            = var.kvcached_volume_throughput
        encrypted             = true
        delete_on_termination = true
      }
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge({ Name = var.name }, local.tags)
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge({ Name = var.name }, local.tags)
  }

  tags = local.tags

  lifecycle {
    create_before_destroy = true

    precondition {
      condition     = length(module.node.user_data) <= 16384
      error_message = "The rendered user-data is over EC2's 16 KiB limit."
    }
  }
}

resource "aws_autoscaling_group" "gpu" {
  name_prefix         = "${var.name}-"
  vpc_zone_identifier = var.subnet_ids
  desired_capacity    = var.desired_capacity
  min_size            = var.min_size
  max_size            = var.max_size
  health_check_type   = "EC2"

  launch_template {
    id      = aws_launch_template.gpu.id
    version = aws_launch_template.gpu.latest_version
  }

  # A new launch template version (new release, new config) replaces instances gradually.
  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = 50
    }
  }

  dynamic "tag" {
    for_each = merge({ Name = var.name }, local.tags)
    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }

  lifecycle {
    create_before_destroy = true
  }
}
