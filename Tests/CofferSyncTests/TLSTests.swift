import CofferCrypto
import CofferSync
import CofferTestSupport
import CofferVault
import Foundation
import Testing

/// HTTPS to a real `coffer-server --tls-cert --tls-key`, the plain-HTTP policy, and the server id
/// every request signature covers.
@Suite(.serialized) struct TLSTests {
    /// A self-signed certificate for 127.0.0.1 and its key, made by openssl.
    func certificate(in tmp: TemporaryDirectory) throws -> (cert: String, key: String) {
        let cert = tmp.path + "/cert.pem"
        let key = tmp.path + "/key.pem"
        let r = run(
            "/usr/bin/openssl",
            [
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                "-addext", "subjectAltName=IP:127.0.0.1",
            ])
        guard r.status == 0 else { throw TestFailure("openssl: \(r.err)") }
        return (cert, key)
    }

    @Test func devicesSyncOverHTTPSTrustingTheServersCertificate() async throws {
        let tmp = TemporaryDirectory("coffer-tls")
        let (cert, key) = try certificate(in: tmp)
        let server = try ServerProcess(
            dataDirectory: tmp.sub("server"), extraArguments: ["--tls-cert", cert, "--tls-key", key])
        #expect(server.url.hasPrefix("https://"))
        let pem = try #require(FileManager.default.contents(atPath: cert)).map { $0 }
        let secret = AccountSecret.generate()

        let a = try Vault.create(dataDirectory: tmp.sub("a"), username: "tlsuser", secret: secret)
        try a.setServer(server.url, trustedCertificatePEM: pem)
        let engineA = try SyncEngine.forStore(a)
        try await engineA.register()
        let root = try a.resolve("/")
        let doc = try a.create(in: root.id, name: "over-tls.txt", type: .document, mode: 0o644)
        try a.writeAll(doc.id, Array("sealed twice".utf8))
        try await engineA.sync()
        #expect(a.serverSettings?.pinnedID?.count == 16)

        let b = try Vault.create(dataDirectory: tmp.sub("b"), username: "tlsuser", secret: secret, createRoot: false)
        try b.setServer(server.url, trustedCertificatePEM: pem)
        try await SyncEngine.forStore(b).sync()
        #expect(String(decoding: try b.readAll(b.resolve("/over-tls.txt").id), as: UTF8.self) == "sealed twice")

        // Without the certificate the server is not trusted: nothing is sent.
        let c = try Vault.create(dataDirectory: tmp.sub("c"), username: "tlsuser", secret: secret, createRoot: false)
        try c.setServer(server.url)
        let untrusting = SyncEngine(vault: c, transport: HTTPTransport(baseURL: server.url, timeout: .seconds(30)))
        do {
            try await untrusting.sync()
            Issue.record("a server with an untrusted certificate was synced with")
        } catch {
            // The handshake's refusal itself, found within the connect timeout, not a timeout.
            #expect(
                "\(error)".contains("TLS handshake") && "\(error)".contains("CERTIFICATE_VERIFY_FAILED"), "\(error)")
        }
        #expect(!c.hasRoot)
    }

    @Test func aServerWhoseIdChangedIsRefused() async throws {
        let world = try await SyncWorld(devices: 1)
        try world.a.write("/x.txt", "x")
        try await world.a.sync()
        let pinned = try #require(world.a.vault.serverSettings?.pinnedID)
        // Another server answers at the same address (here: the same data without its id file).
        world.server.stop()
        #expect(unlink(world.server.dataDirectory + "/server.id") == 0)
        try world.server.start()
        do {
            try await world.a.sync()
            Issue.record("a server with another id was trusted")
        } catch {
            #expect("\(error)".contains("not the one this device synced with"), "\(error)")
        }
        #expect(world.a.vault.serverSettings?.pinnedID == pinned)
    }

    @Test func plainHTTPOnlyToThisMachineUnlessAllowed() throws {
        for ok in [
            "https://example.org", "https://10.0.0.1:8443", "http://127.0.0.1:8080", "http://127.3.4.5",
            "http://localhost:1",
            "http://[::1]:8080",
        ] {
            #expect(try HTTPTransport.checkedURL(ok, allowInsecureHTTP: false) == ok)
        }
        for refused in [
            "http://10.0.0.1:8080", "http://example.org", "http://128.0.0.1", "ftp://127.0.0.1", "127.0.0.1:8080",
            "https://",
        ] {
            #expect(throws: SyncError.self, "\(refused)") {
                try HTTPTransport.checkedURL(refused, allowInsecureHTTP: false)
            }
        }
        #expect(try HTTPTransport.checkedURL("http://10.0.0.1:8080", allowInsecureHTTP: true) == "http://10.0.0.1:8080")

        // The CLI checks before it creates anything, and says why.
        let tmp = TemporaryDirectory("coffer-http-policy")
        let r = coffer(tmp.sub("store"), ["init", "alice", "--server", "http://192.0.2.1:8080"])
        #expect(r.status != 0 && r.err.contains("refusing plain http://"), "\(r.err)")
        #expect(!FileManager.default.fileExists(atPath: tmp.sub("store") + "/account.secret"))
    }
}
