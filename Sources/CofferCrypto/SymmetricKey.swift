import CSodium

/// What a ciphertext is for. It goes into the associated data, so a sealed name can never be
/// accepted as sealed content, a key wrap, or the attributes of another file.
public enum SealPurpose: UInt8, Sendable {
    case name = 1
    case keyWrap = 2
    case attributes = 3
    case chunk = 4
    case manifest = 5
    case accountKey = 6
}

/// A 32-byte XChaCha20-Poly1305 key: every file has its own.
public struct SymmetricKey: Sendable, Hashable {
    public static let byteCount = 32
    public let bytes: [UInt8]

    public init(bytes: [UInt8]) throws {
        guard bytes.count == Self.byteCount else { throw CryptoError.invalidLength("a symmetric key has \(Self.byteCount) bytes, got \(bytes.count)") }
        self.bytes = bytes
    }

    /// A fresh random key.
    public static func random() -> SymmetricKey {
        ensureSodium()
        var k = [UInt8](repeating: 0, count: byteCount)
        crypto_aead_xchacha20poly1305_ietf_keygen(&k)
        return SymmetricKey(unchecked: k)
    }

    init(unchecked: [UInt8]) { self.bytes = unchecked }

    /// Derives an independent subkey so one key never serves two primitives (AEAD vs MAC).
    public func derive(subkeyID: UInt64, context: String) -> SymmetricKey {
        ensureSodium()
        var ctx = Array(context.utf8.prefix(8))
        while ctx.count < 8 { ctx.append(0x5f) }
        var out = [UInt8](repeating: 0, count: 32)
        ctx.withUnsafeBufferPointer { c in
            c.withMemoryRebound(to: CChar.self) { cc in
                _ = crypto_kdf_derive_from_key(&out, 32, subkeyID, cc.baseAddress!, bytes)
            }
        }
        return SymmetricKey(unchecked: out)
    }
}

/// Authenticated encryption with XChaCha20-Poly1305 (IETF). The output is nonce || ciphertext.
public enum AEAD {
    public static let nonceBytes = 24
    public static let tagBytes = 16
    public static let overhead = nonceBytes + tagBytes

    /// Associated data that binds a ciphertext to its file and purpose: version, purpose, id.
    public static func associatedData(purpose: SealPurpose, fileID: [UInt8], extra: [UInt8] = []) -> [UInt8] {
        var ad: [UInt8] = [0x43, 0x46, 1, purpose.rawValue] // "CF", format version 1
        ad.append(UInt8(fileID.count))
        ad += fileID
        ad += extra
        return ad
    }

    public static func seal(_ plaintext: [UInt8], key: SymmetricKey, purpose: SealPurpose, fileID: [UInt8], extra: [UInt8] = []) -> [UInt8] {
        plaintext.withUnsafeBytes { seal(UnsafeRawBufferPointer($0), key: key, purpose: purpose, fileID: fileID, extra: extra) }
    }

    public static func seal(_ plaintext: UnsafeRawBufferPointer, key: SymmetricKey, purpose: SealPurpose, fileID: [UInt8], extra: [UInt8] = []) -> [UInt8] {
        ensureSodium()
        let ad = associatedData(purpose: purpose, fileID: fileID, extra: extra)
        let nonce = randomBytes(nonceBytes)
        // Written in place, not zero-filled first: for a 256 KiB chunk the fill was a whole
        // extra pass over memory on every write.
        let total = nonceBytes + plaintext.count + tagBytes
        return [UInt8](unsafeUninitializedCapacity: total) { o, initialized in
            guard let base = o.baseAddress else { initialized = 0; return }
            for i in 0..<nonceBytes { base[i] = nonce[i] }
            if Bulk.sealXChaCha(plaintext, ad: ad, nonce: nonce, key: key.bytes, into: base + nonceBytes) {
                initialized = total
                return
            }
            var clen: UInt64 = 0
            _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
                base + nonceBytes, &clen,
                plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
                ad, UInt64(ad.count), nil, nonce, key.bytes)
            initialized = total
        }
    }

    public static func open(_ sealed: [UInt8], key: SymmetricKey, purpose: SealPurpose, fileID: [UInt8], extra: [UInt8] = [], what: String) throws -> [UInt8] {
        ensureSodium()
        guard sealed.count >= overhead else { throw CryptoError.authenticationFailed(what) }
        let ad = associatedData(purpose: purpose, fileID: fileID, extra: extra)
        let length = sealed.count - overhead
        var mlen: UInt64 = 0
        var rc: Int32 = -1
        // Written by the decryption, not zeroed first (a 256 KiB chunk's memset saved per read).
        let out = [UInt8](unsafeUninitializedCapacity: length) { o, count in
            // BoringSSL or libcrypto (`Bulk`); if it refuses, libsodium decides (a forged or
            // damaged value then costs two attempts, an intact one never does).
            if let ob = o.baseAddress,
               sealed.withUnsafeBytes({ s in Bulk.openXChaCha(UnsafeRawBufferPointer(rebasing: s[nonceBytes...]), ad: ad,
                                                             nonce: Array(s[0..<nonceBytes]), key: key.bytes, into: ob) }) {
                rc = 0
                count = length
                return
            }
            rc = sealed.withUnsafeBufferPointer { s in
                crypto_aead_xchacha20poly1305_ietf_decrypt(
                    o.baseAddress, &mlen, nil,
                    s.baseAddress! + nonceBytes, UInt64(sealed.count - nonceBytes),
                    ad, UInt64(ad.count), s.baseAddress!, key.bytes)
            }
            count = rc == 0 && mlen == UInt64(length) ? length : 0
        }
        guard rc == 0, out.count == length else { throw CryptoError.authenticationFailed(what) }
        return out
    }
}

extension AEAD {
    /// `open` without a second buffer: decrypts `sealed` where it lies and returns where the
    /// plaintext now is (`nonceBytes..<count - tagBytes`). A 256 KiB chunk read back otherwise
    /// costs a fresh buffer and, for a raw chunk, a copy out of it (`ContentCipher.openChunkInPlace`).
    /// If the tag does not verify it throws, and `sealed` may then hold garbage.
    public static func openInPlace(_ sealed: inout [UInt8], key: SymmetricKey, purpose: SealPurpose, fileID: [UInt8],
                                   extra: [UInt8] = [], what: String) throws -> Range<Int> {
        guard sealed.count >= overhead else { throw CryptoError.authenticationFailed(what) }
        let length = sealed.count - overhead
        guard Bulk.engine(for: length) == .boringSSL else {
            // libcrypto's path may fail for reasons other than the tag (an allocation), and its
            // fallback to libsodium needs the ciphertext intact: out of place, as `open` does it.
            sealed = try open(sealed, key: key, purpose: purpose, fileID: fileID, extra: extra, what: what)
            return 0..<sealed.count
        }
        let ad = associatedData(purpose: purpose, fileID: fileID, extra: extra)
        let nonce = Array(sealed[0..<nonceBytes])
        // BoringSSL fails only on a bad tag here (key and nonce lengths are right): nothing to
        // fall back to. It allows `in == out` exactly.
        let ok = sealed.withUnsafeMutableBufferPointer { s -> Bool in
            guard let base = s.baseAddress else { return false }
            let body = base + nonceBytes
            return Bulk.openXChaCha(UnsafeRawBufferPointer(start: body, count: length + tagBytes), ad: ad, nonce: nonce,
                                    key: key.bytes, into: body, engine: .boringSSL)
        }
        guard ok else { throw CryptoError.authenticationFailed(what) }
        return nonceBytes..<(nonceBytes + length)
    }
}

/// A keyed MAC (BLAKE2b-256) over a name, keyed by a subkey of the parent folder's key. Equal
/// names in one folder give equal MACs, so the server can enforce unique names blindly.
public enum NameMAC {
    public static func mac(name: String, parentKey: SymmetricKey) -> [UInt8] {
        let k = parentKey.derive(subkeyID: 1, context: "cfname")
        return blake2b(Array("coffer-name-v1".utf8) + [0] + Array(name.utf8), key: k.bytes)
    }
}
