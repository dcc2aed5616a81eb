import CofferTestSupport
import Foundation
import Testing

/// The tests' child processes must not inherit descriptors: tests run in parallel in one
/// process, and a long-lived child (a server, a mount daemon) holding a file another test opened
/// on its mount makes that mount's unmount fail with EBUSY (seen in CI).
@Suite struct SpawnTests {
    @Test func childrenInheritNoDescriptorsBeyondStdio() throws {
        let fd = open("/dev/null", O_RDONLY)  // deliberately without O_CLOEXEC
        try #require(fd > 2)
        defer { close(fd) }
        let result = run(
            "/bin/sh", ["-c", "if test -e /proc/self/fd/\(fd); then echo inherited; else echo closed; fi"])
        #expect(result.status == 0)
        #expect(String(decoding: result.stdout, as: UTF8.self) == "closed\n")
    }
}
