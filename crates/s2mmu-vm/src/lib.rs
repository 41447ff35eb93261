//! A simulated VM on the s2mmu engine.
