variable "name" {
  description = "Name prefix of the launch template, the autoscaling group and the instances."
  type        = string
  default     = "oasis-gpu"
}

variable "ami_id" {
  description = "GPU AMI: Ubuntu or Debian with cloud-init and the NVIDIA driver installed (an AWS Deep Learning Base AMI, or your own)."
  type        = string

  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.ami_id))
    error_message = "The ami_id must be an AMI id (ami-...)."
  }
}

variable "instance_type" {
  description = "GPU instance type (g5.xlarge: 1 A10G; g6e.xlarge: 1 L40S; p4d.24xlarge: 8 A100; p5.48xlarge: 8 H100)."
  type        = string
  default     = "g5.xlarge"
}

variable "desired_capacity" {
  description = "Instances the group keeps running."
  type        = number
  default     = 1
}

variable "min_size" {
  description = "Smallest group size."
  type        = number
  default     = 0
}

variable "max_size" {
  description = "Largest group size."
  type        = number
  default     = 4

  validation {
    condition     = var.max_size >= 1
    error_message = "The max_size must be at least 1."
  }
}

variable "subnet_ids" {
  description = "Subnets the group places instances in (one per availability zone that has the instance type)."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) > 0
    error_message = "The subnet_ids must name at least one subnet."
  }
}

variable "security_group_ids" {
  description = "Security groups of the instances: they must allow Consul serf LAN (8301 tcp/udp) with the Consul servers and other clients, Nomad RPC (4647) to the servers, and the servers to reach the clients' Nomad HTTP (4646) and the allocations' dynamic ports (20000-32000) from whatever routes to the engines."
  type        = list(string)
}

variable "iam_instance_profile" {
  description = "IAM instance profile name; empty for none. Cloud auto-join (provider=aws in nomad_servers / consul_retry_join) needs ec2:DescribeInstances."
  type        = string
  default     = ""
}

variable "key_name" {
  description = "EC2 key pair for SSH; empty for none."
  type        = string
  default     = ""
}

variable "root_volume_size_gb" {
  description = "Root EBS volume (gp3) size: engines' images and model weights land there unless you mount more."
  type        = number
  default     = 200
}

variable "kvcached_volume_size_gb" {
  description = "Size of an extra gp3 EBS volume (attached as /dev/sdf) for kvcached's disk tier; 0 for none. With one, set kvcached_device to where it appears in the instance."
  type        = number
  default     = 0
}

variable "kvcached_volume_iops" {
  description = "Provisioned IOPS of the kvcached gp3 volume."
  type        = number
  default     = 6000
}

variable "kvcached_volume_throughput" {
  description = "Throughput (MiB/s) of the kvcached gp3 volume."
  type        = number
  default     = 500
}

variable "kvcached_device" {
  description = "Block device for kvcached's disk tier, formatted if blank and mounted by the install script; empty for a directory on the root volume. Nitro instances show every disk as NVMe, the root volume as /dev/nvme0n1: on GPU types with instance-store NVMe (g5, g6, g6e, p4d, p5) /dev/nvme1n1 is usually the first instance-store disk (ephemeral, which suits a cache); with kvcached_volume_size_gb > 0 on a type without instance store, the EBS volume is usually /dev/nvme1n1. NVMe numbering is not guaranteed: check your instance type."
  type        = string
  default     = "/dev/nvme1n1"
}

variable "nomad_servers" {
  description = "Nomad server_join.retry_join: addresses or an AWS cloud auto-join string."
  type        = list(string)
  default     = ["provider=aws tag_key=nomad-role tag_value=server"]
}

variable "consul_retry_join" {
  description = "Consul retry_join: addresses or an AWS cloud auto-join string."
  type        = list(string)
  default     = ["provider=aws tag_key=consul-role tag_value=server"]
}

variable "tags" {
  description = "Tags on every resource and instance."
  type        = map(string)
  default     = {}
}
