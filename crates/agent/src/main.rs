//! `sticky-vxlan-agent`: the node agent that keeps sticky-vxlan's peers file from the
//! Kubernetes API. A program of its own, so the plugin kubelet executes per pod links no TLS,
//! HTTP or YAML. See docs/agent.md.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    sticky_vxlan_agent::main(&args)
}
