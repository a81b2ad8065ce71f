package blockdigest

import "math/bits"

// BLAKE3's compression function for the one-block case, written from the BLAKE3
// specification (section 2.2). guts.CompressNode computes the same, but takes its
// 112-byte node by value; building that node from fresh 4-byte stores and copying
// it with 16-byte loads stalls on store forwarding, which cost about as much as
// the compression itself. TestPathsAgreeWithReference checks the two agree.

var iv = [4]uint32{0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A}

// compress16 returns the first four output words of compressing block m under
// chaining value cv with counter 0.
func compress16(cv *[8]uint32, m *[16]uint32, blockLen, flags uint32) [4]uint32 {
	v0, v1, v2, v3 := cv[0], cv[1], cv[2], cv[3]
	v4, v5, v6, v7 := cv[4], cv[5], cv[6], cv[7]
	v8, v9, v10, v11 := iv[0], iv[1], iv[2], iv[3]
	v12, v13, v14, v15 := uint32(0), uint32(0), blockLen, flags
	m0, m1, m2, m3, m4, m5, m6, m7 := m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]
	m8, m9, m10, m11, m12, m13, m14, m15 := m[8], m[9], m[10], m[11], m[12], m[13], m[14], m[15]
	for r := 0; r < 7; r++ {
		v0, v4, v8, v12 = g(v0, v4, v8, v12, m0, m1)
		v1, v5, v9, v13 = g(v1, v5, v9, v13, m2, m3)
		v2, v6, v10, v14 = g(v2, v6, v10, v14, m4, m5)
		v3, v7, v11, v15 = g(v3, v7, v11, v15, m6, m7)
		v0, v5, v10, v15 = g(v0, v5, v10, v15, m8, m9)
		v1, v6, v11, v12 = g(v1, v6, v11, v12, m10, m11)
		v2, v7, v8, v13 = g(v2, v7, v8, v13, m12, m13)
		v3, v4, v9, v14 = g(v3, v4, v9, v14, m14, m15)
		// Message permutation 2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8.
		m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 =
			m2, m6, m3, m10, m7, m0, m4, m13, m1, m11, m12, m5, m9, m14, m15, m8
	}
	return [4]uint32{v0 ^ v8, v1 ^ v9, v2 ^ v10, v3 ^ v11}
}

func g(a, b, c, d, mx, my uint32) (uint32, uint32, uint32, uint32) {
	a += b + mx
	d = bits.RotateLeft32(d^a, -16)
	c += d
	b = bits.RotateLeft32(b^c, -12)
	a += b + my
	d = bits.RotateLeft32(d^a, -8)
	c += d
	b = bits.RotateLeft32(b^c, -7)
	return a, b, c, d
}
