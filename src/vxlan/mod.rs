//! sticky-vxlan.
