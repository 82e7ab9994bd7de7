// PLACEHOLDER for the packaging branch only: the real binary comes from another
// branch. On merge, take the other side of this file.
fn main() {}
