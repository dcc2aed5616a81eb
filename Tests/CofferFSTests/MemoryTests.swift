import CofferTestSupport
import Foundation
import Testing

/// A 2 GiB file written through the mount keeps the daemon's resident memory bounded.
@Suite struct MemoryTests {
    @Test func twoGiBWithDdStaysUnder300MB() throws {
        let m = try MountFixture("coffer-fs-memory")
        guard let pid = m.daemonPID else {
            Issue.record("no daemon pid")
            return
        }
        // Random bytes: zeros would compress to almost nothing and dedupe to one chunk, so
        // the daemon would never hold a buffer of real chunks.
        let source = m.tmp.path + "/source.bin"
        let made = sh("head -c 2147483648 /dev/urandom | tee '\(source)' | md5sum")
        try #require(made.status == 0 && statOf(source)?.st_size == 2 << 30, "\(made.err)")
        let expected = made.out.prefix(32)
        let before = processMemoryKiB(pid, "VmHWM") ?? 0
        let start = Date()
        let dd = run("/bin/dd", ["if=" + source, "of=" + m.path("big"), "bs=1M", "conv=fsync"])
        let writeTime = Date().timeIntervalSince(start)
        #expect(dd.status == 0, "\(dd.err)")
        let peakKiB = processMemoryKiB(pid, "VmHWM") ?? Int.max
        print(
            "2 GiB of random bytes, dd conv=fsync through the mount: \(String(format: "%.1f", writeTime)) s; "
                + "daemon VmHWM \(peakKiB / 1024) MiB (\(peakKiB) KiB; \(before / 1024) MiB before)")
        #expect(peakKiB < 300_000_000 / 1024, "daemon peak RSS \(peakKiB) KiB")
        #expect(statOf(m.path("big"))?.st_size == 2 << 30)
        #expect(unlink(source) == 0)

        // Read it back from the store, not the page cache.
        try m.unmount()
        try m.mount()
        let readStart = Date()
        let md5 = run("/usr/bin/md5sum", [m.path("big")])
        let readTime = Date().timeIntervalSince(readStart)
        #expect(md5.status == 0)
        #expect(md5.out.prefix(32) == expected)
        let readPeak = m.daemonPID.flatMap { processMemoryKiB($0, "VmHWM") } ?? Int.max
        print("2 GiB md5sum read back: \(String(format: "%.1f", readTime)) s; daemon VmHWM \(readPeak / 1024) MiB")
        #expect(readPeak < 300_000_000 / 1024, "daemon peak RSS while reading \(readPeak) KiB")
    }
}
