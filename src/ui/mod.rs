pub mod blockmap;
#[doc(hidden)]
pub mod fixtures;
pub mod fragmentation;
pub mod theme;
