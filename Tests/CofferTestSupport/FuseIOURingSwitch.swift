import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The fuse module's switch for FUSE over io_uring (Linux 6.14+, `enable_uring`). The kernel
/// offers io_uring at INIT only while it is on, and a connection that took it keeps it, so tests
/// turn it on just around a mount's start: mounts other tests make meanwhile see the machine's
/// own setting (off by default).
public enum FuseIOURingSwitch {
    public static let path = "/sys/module/fuse/parameters/enable_uring"
    private static let lock = NSLock()

    /// This kernel has FUSE over io_uring and this process may turn it on.
    public static var available: Bool { access(path, W_OK) == 0 }

    /// Runs `body` with the switch on, then puts it back as it was; one caller at a time.
    public static func whileOn<T>(_ body: () throws -> T) throws -> T {
        lock.lock()
        defer { lock.unlock() }
        let wasOn = ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "N").hasPrefix("Y")
        if !wasOn { try set(true) }
        defer { if !wasOn { try? set(false) } }
        return try body()
    }

    private static func set(_ on: Bool) throws {
        let fd = open(path, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { throw FixtureError("open \(path): errno \(errno)") }
        defer { close(fd) }
        guard write(fd, on ? "Y" : "N", 1) == 1 else { throw FixtureError("write \(path): errno \(errno)") }
    }
}
