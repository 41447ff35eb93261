//! A tiny x86-64 encoder for the handful of instructions the guest programs need.
//!
//! The crate assembles its guest code itself so that running it needs no external
//! toolchain. Every instruction takes 64-bit general registers (kvm_pvm runs the
//! guest natively at CPL 3, but general registers keep it safe even if it were emulated),
//! except `movq` between a general and an SSE register, for guests that keep a value in
//! their SSE state (they must run natively: KVM's emulator lacks SSE).
//! Memory operands are always `[base + disp32]`, which avoids the short-form special cases
//! of ModRM at the cost of a few bytes.

/// A 64-bit general-purpose register, numbered as in the ModRM/REX encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum Reg {
    Rax = 0,
    Rcx = 1,
    Rdx = 2,
    Rbx = 3,
    Rsp = 4,
    Rbp = 5,
    Rsi = 6,
    Rdi = 7,
    R8 = 8,
    R9 = 9,
    R10 = 10,
    R11 = 11,
    R12 = 12,
    R13 = 13,
    R14 = 14,
    R15 = 15,
}

impl Reg {
    fn low3(self) -> u8 {
        self as u8 & 7
    }
    fn high(self) -> u8 {
        (self as u8 >> 3) & 1
    }
}

/// A position in the code that jumps can target; bound once with [`Assembler::bind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label(usize);

/// A jump condition (the low nibble of the `0F 8x` opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Cond {
    /// Unsigned below (CF = 1).
    Below = 0x2,
    /// Unsigned above or equal (CF = 0).
    AboveOrEqual = 0x3,
    /// Equal (ZF = 1).
    Equal = 0x4,
    /// Not equal (ZF = 0).
    NotEqual = 0x5,
}

/// Assembles instructions into a byte buffer, resolving labels when finished.
#[derive(Debug, Default)]
pub struct Assembler {
    code: Vec<u8>,
    labels: Vec<Option<usize>>,
    /// (offset of the rel32 field, label) pairs to patch in [`Assembler::finish`].
    fixups: Vec<(usize, Label)>,
}

/// An error in the program being assembled (a label used but never bound).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnboundLabel(pub usize);

impl Assembler {
    /// An empty program.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new label, not yet bound to a position.
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Binds `label` to the current position.
    pub fn bind(&mut self, label: Label) {
        self.labels[label.0] = Some(self.code.len());
    }

    fn rex_w(&mut self, reg: u8, rm: u8) {
        self.code.push(0x48 | (reg << 2) | rm);
    }

    /// `op r/m64, r64` with a register r/m operand.
    fn rr(&mut self, opcode: u8, rm: Reg, reg: Reg) {
        self.rex_w(reg.high(), rm.high());
        self.code.push(opcode);
        self.code.push(0xC0 | (reg.low3() << 3) | rm.low3());
    }

    /// `opcode` with a `/ext` register r/m operand (group opcodes such as C1, 81, FF).
    fn ext(&mut self, opcode: u8, ext: u8, rm: Reg) {
        self.rex_w(0, rm.high());
        self.code.push(opcode);
        self.code.push(0xC0 | (ext << 3) | rm.low3());
    }

    /// `opcode` with a `[base + disp32]` operand and register `reg`.
    fn mem(&mut self, opcode: u8, reg: Reg, base: Reg, disp: i32) {
        self.rex_w(reg.high(), base.high());
        self.code.push(opcode);
        self.code.push(0x80 | (reg.low3() << 3) | base.low3());
        if base.low3() == 4 {
            // rsp and r12 as a base need a SIB byte (no index, base = that register).
            self.code.push(0x24);
        }
        self.code.extend_from_slice(&disp.to_le_bytes());
    }

    /// `mov dst, src`.
    pub fn mov_rr(&mut self, dst: Reg, src: Reg) {
        self.rr(0x89, dst, src);
    }

    /// `movabs dst, imm64`.
    pub fn mov_ri64(&mut self, dst: Reg, imm: u64) {
        self.rex_w(0, dst.high());
        self.code.push(0xB8 + dst.low3());
        self.code.extend_from_slice(&imm.to_le_bytes());
    }

    /// `mov dst, qword [base + disp]`.
    pub fn load(&mut self, dst: Reg, base: Reg, disp: i32) {
        self.mem(0x8B, dst, base, disp);
    }

    /// `mov qword [base + disp], src`.
    pub fn store(&mut self, base: Reg, disp: i32, src: Reg) {
        self.mem(0x89, src, base, disp);
    }

    /// `xor dst, src`.
    pub fn xor_rr(&mut self, dst: Reg, src: Reg) {
        self.rr(0x31, dst, src);
    }

    /// `or dst, src`.
    pub fn or_rr(&mut self, dst: Reg, src: Reg) {
        self.rr(0x09, dst, src);
    }

    /// `add dst, src`.
    pub fn add_rr(&mut self, dst: Reg, src: Reg) {
        self.rr(0x01, dst, src);
    }

    /// `movq xmm{xmm}, src` (`xmm` in 0..16, taken modulo 16).
    pub fn movq_to_xmm(&mut self, xmm: u8, src: Reg) {
        self.xmm_gpr(0x6E, xmm, src);
    }

    /// `movq dst, xmm{xmm}` (`xmm` in 0..16, taken modulo 16).
    pub fn movq_from_xmm(&mut self, dst: Reg, xmm: u8) {
        self.xmm_gpr(0x7E, xmm, dst);
    }

    fn xmm_gpr(&mut self, opcode: u8, xmm: u8, gpr: Reg) {
        let xmm = xmm & 15;
        self.code.push(0x66);
        self.rex_w(xmm >> 3, gpr.high());
        self.code.extend_from_slice(&[0x0F, opcode]);
        self.code.push(0xC0 | ((xmm & 7) << 3) | gpr.low3());
    }

    /// `rdtsc` (the TSC in `edx:eax`, upper halves cleared).
    pub fn rdtsc(&mut self) {
        self.code.extend_from_slice(&[0x0F, 0x31]);
    }

    /// `cmp lhs, rhs` (flags from `lhs - rhs`).
    pub fn cmp_rr(&mut self, lhs: Reg, rhs: Reg) {
        self.rr(0x39, lhs, rhs);
    }

    /// `shl dst, imm8`.
    pub fn shl_ri(&mut self, dst: Reg, imm: u8) {
        self.ext(0xC1, 4, dst);
        self.code.push(imm);
    }

    /// `shr dst, imm8`.
    pub fn shr_ri(&mut self, dst: Reg, imm: u8) {
        self.ext(0xC1, 5, dst);
        self.code.push(imm);
    }

    /// `add dst, imm32` (sign-extended).
    pub fn add_ri(&mut self, dst: Reg, imm: i32) {
        self.ext(0x81, 0, dst);
        self.code.extend_from_slice(&imm.to_le_bytes());
    }

    /// `and dst, imm32` (sign-extended).
    pub fn and_ri(&mut self, dst: Reg, imm: i32) {
        self.ext(0x81, 4, dst);
        self.code.extend_from_slice(&imm.to_le_bytes());
    }

    /// `dec dst`.
    pub fn dec(&mut self, dst: Reg) {
        self.ext(0xFF, 1, dst);
    }

    /// `jmp target` (rel32).
    pub fn jmp(&mut self, target: Label) {
        self.code.push(0xE9);
        self.rel32(target);
    }

    /// `jcc target` (rel32).
    pub fn jcc(&mut self, cond: Cond, target: Label) {
        self.code.push(0x0F);
        self.code.push(0x80 | cond as u8);
        self.rel32(target);
    }

    fn rel32(&mut self, target: Label) {
        self.fixups.push((self.code.len(), target));
        self.code.extend_from_slice(&[0; 4]);
    }

    /// Resolves the jumps and returns the machine code.
    ///
    /// # Errors
    /// [`UnboundLabel`] when a jump targets a label that was never bound.
    pub fn finish(mut self) -> Result<Vec<u8>, UnboundLabel> {
        for &(at, label) in &self.fixups {
            let target = self.labels[label.0].ok_or(UnboundLabel(label.0))?;
            // rel32 is relative to the end of the 4-byte field; code is far below 2 GiB.
            let rel = target as i64 - (at as i64 + 4);
            self.code[at..at + 4].copy_from_slice(&(rel as i32).to_le_bytes());
        }
        Ok(self.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected bytes come from GNU as (`as --64`, then `objdump -d`) for the same text.

    #[test]
    fn register_forms_match_gnu_as() {
        let mut a = Assembler::new();
        a.mov_rr(Reg::Rbx, Reg::R10); // mov %r10,%rbx
        a.xor_rr(Reg::R10, Reg::Rbx); // xor %rbx,%r10
        a.cmp_rr(Reg::Rbx, Reg::R11); // cmp %r11,%rbx
        a.shl_ri(Reg::Rbx, 13); // shl $13,%rbx
        a.shr_ri(Reg::R15, 7); // shr $7,%r15
        a.add_ri(Reg::Rcx, 4096); // add $0x1000,%rcx
        a.and_ri(Reg::Rbx, 0xffff); // and $0xffff,%rbx
        a.dec(Reg::Rdx); // dec %rdx
        a.dec(Reg::R13); // dec %r13
        a.mov_ri64(Reg::R9, 0x0123_4567_89ab_cdef); // movabs $..,%r9
        let code = a.finish().unwrap();
        let expected: &[u8] = &[
            0x4c, 0x89, 0xd3, // mov %r10,%rbx
            0x49, 0x31, 0xda, // xor %rbx,%r10
            0x4c, 0x39, 0xdb, // cmp %r11,%rbx
            0x48, 0xc1, 0xe3, 0x0d, // shl $13,%rbx
            0x49, 0xc1, 0xef, 0x07, // shr $7,%r15
            0x48, 0x81, 0xc1, 0x00, 0x10, 0x00, 0x00, // add $0x1000,%rcx
            0x48, 0x81, 0xe3, 0xff, 0xff, 0x00, 0x00, // and $0xffff,%rbx
            0x48, 0xff, 0xca, // dec %rdx
            0x49, 0xff, 0xcd, // dec %r13
            0x49, 0xb9, 0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, // movabs
        ];
        assert_eq!(code, expected);
    }

    #[test]
    fn sse_and_tsc_forms_match_gnu_as() {
        let mut a = Assembler::new();
        a.movq_to_xmm(0, Reg::Rax); // movq %rax,%xmm0
        a.movq_to_xmm(9, Reg::R10); // movq %r10,%xmm9
        a.movq_from_xmm(Reg::Rbx, 0); // movq %xmm0,%rbx
        a.movq_from_xmm(Reg::R11, 12); // movq %xmm12,%r11
        a.rdtsc();
        a.or_rr(Reg::Rax, Reg::Rdx); // or %rdx,%rax
        a.or_rr(Reg::R10, Reg::R9); // or %r9,%r10
        a.add_rr(Reg::Rcx, Reg::R11); // add %r11,%rcx
        let code = a.finish().unwrap();
        let expected: &[u8] = &[
            0x66, 0x48, 0x0f, 0x6e, 0xc0, //
            0x66, 0x4d, 0x0f, 0x6e, 0xca, //
            0x66, 0x48, 0x0f, 0x7e, 0xc3, //
            0x66, 0x4d, 0x0f, 0x7e, 0xe3, //
            0x0f, 0x31, //
            0x48, 0x09, 0xd0, //
            0x4d, 0x09, 0xca, //
            0x4c, 0x01, 0xd9, //
        ];
        assert_eq!(code, expected);
    }

    #[test]
    fn memory_forms_match_gnu_as() {
        let mut a = Assembler::new();
        a.store(Reg::Rcx, 0, Reg::Rax); // mov %rax,0x0(%rcx) (disp32)
        a.load(Reg::R11, Reg::R9, 8); // mov 0x8(%r9),%r11 (disp32)
        a.store(Reg::R12, -8, Reg::Rax); // mov %rax,-0x8(%r12) (needs SIB)
        a.load(Reg::Rbx, Reg::Rsp, 0x10); // mov 0x10(%rsp),%rbx (needs SIB)
        a.load(Reg::Rax, Reg::R13, 0); // mov 0x0(%r13),%rax
        let code = a.finish().unwrap();
        let expected: &[u8] = &[
            0x48, 0x89, 0x81, 0x00, 0x00, 0x00, 0x00, //
            0x4d, 0x8b, 0x99, 0x08, 0x00, 0x00, 0x00, //
            0x49, 0x89, 0x84, 0x24, 0xf8, 0xff, 0xff, 0xff, //
            0x48, 0x8b, 0x9c, 0x24, 0x10, 0x00, 0x00, 0x00, //
            0x49, 0x8b, 0x85, 0x00, 0x00, 0x00, 0x00, //
        ];
        assert_eq!(code, expected);
    }

    #[test]
    fn jumps_resolve_backwards_and_forwards() {
        let mut a = Assembler::new();
        let top = a.label();
        let out = a.label();
        a.bind(top);
        a.dec(Reg::Rdx); // 3 bytes, at 0
        a.jcc(Cond::Equal, out); // 6 bytes, at 3: rel = 21 - 9 = 12
        a.jcc(Cond::NotEqual, top); // 6 bytes, at 9: rel = 0 - 15 = -15
        a.jcc(Cond::Below, out); // never taken here; just the opcode
        a.bind(out);
        a.jmp(top); // at 21: rel = 0 - 26 = -26
        let code = a.finish().unwrap();
        let expected: &[u8] = &[
            0x48, 0xff, 0xca, //
            0x0f, 0x84, 0x0c, 0x00, 0x00, 0x00, // je +12 (to 21)
            0x0f, 0x85, 0xf1, 0xff, 0xff, 0xff, // jne -15 (to 0)
            0x0f, 0x82, 0x00, 0x00, 0x00, 0x00, // jb +0 (to 21)
            0xe9, 0xe6, 0xff, 0xff, 0xff, // jmp -26 (to 0)
        ];
        assert_eq!(code, expected);
    }

    #[test]
    fn unbound_label_is_an_error() {
        let mut a = Assembler::new();
        let nowhere = a.label();
        a.jmp(nowhere);
        assert_eq!(a.finish(), Err(UnboundLabel(0)));
    }
}
