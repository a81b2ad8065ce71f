# Who may fetch KV blocks from a node's kvcached over QUIC: the other kvcached nodes (peers,
# in this and other datacenters). Engines reach their own node's kvcached over loopback RESP,
# outside the mesh.
Kind = "service-intentions"
Name = "oasis-kvcached"
Sources = [
  {
    Name        = "oasis-kvcached"
    Action      = "allow"
    Description = "kvcached peers"
  },
  {
    Name   = "*"
    Action = "deny"
  },
]
