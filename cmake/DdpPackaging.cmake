# Install rules and the .deb packages (CPack, one package per component; scripts/package).
#   ddpctl      ddpctl, ddp-ncclid (found beside ddpctl), ddpctl(1), bash completion; the standing
#               ddp-coordinator, ddp-coordinator(8) and its systemd unit (not enabled)
#   ddp-agentd  ddp-agentd, ddp-agentd(8), its systemd unit, the default /etc/ddpctl/agent.yaml (a conffile)
# Depends come from dpkg-shlibdeps over the installed binaries, so they name exactly the
# Debian library packages (and versions) the build linked against.
include(GNUInstallDirs)

install(TARGETS ddpctl ddp-ncclid ddp-coordinator RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ddpctl)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/systemd/ddp-coordinator.service DESTINATION lib/systemd/system COMPONENT ddpctl)
install(TARGETS ddp-agentd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT agentd)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/systemd/ddp-agentd.service DESTINATION lib/systemd/system COMPONENT agentd)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/agent.yaml DESTINATION /etc/ddpctl COMPONENT agentd)

# Man pages and bash completion, written by the programs themselves from their CLI definitions
# (lib/cliexport), so they cannot drift from the flags. Into build/share/.
set(ddp_share ${CMAKE_BINARY_DIR}/share)
add_custom_command(
  OUTPUT ${ddp_share}/ddpctl.1.gz ${ddp_share}/ddp-agentd.8.gz ${ddp_share}/ddp-coordinator.8.gz ${ddp_share}/ddpctl.bash-completion
  COMMAND ${CMAKE_COMMAND} -E make_directory ${ddp_share}
  COMMAND sh -c "$<TARGET_FILE:ddpctl> generate man > ${ddp_share}/ddpctl.1 && gzip -9nf ${ddp_share}/ddpctl.1"
  COMMAND sh -c "$<TARGET_FILE:ddp-agentd> --generate-man > ${ddp_share}/ddp-agentd.8 && gzip -9nf ${ddp_share}/ddp-agentd.8"
  COMMAND sh -c "$<TARGET_FILE:ddp-coordinator> --generate-man > ${ddp_share}/ddp-coordinator.8 && gzip -9nf ${ddp_share}/ddp-coordinator.8"
  COMMAND sh -c "$<TARGET_FILE:ddpctl> generate bash-completion > ${ddp_share}/ddpctl.bash-completion"
  DEPENDS ddpctl ddp-agentd ddp-coordinator
  COMMENT "man pages and bash completion from the CLI definitions"
  VERBATIM)
add_custom_target(ddp_cli_docs ALL DEPENDS ${ddp_share}/ddpctl.1.gz ${ddp_share}/ddp-agentd.8.gz ${ddp_share}/ddp-coordinator.8.gz
                                           ${ddp_share}/ddpctl.bash-completion)
install(FILES ${ddp_share}/ddpctl.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT ddpctl)
install(FILES ${ddp_share}/ddpctl.bash-completion DESTINATION share/bash-completion/completions RENAME ddpctl
        COMPONENT ddpctl)
install(FILES ${ddp_share}/ddp-agentd.8.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man8 COMPONENT agentd)
install(FILES ${ddp_share}/ddp-coordinator.8.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man8 COMPONENT ddpctl)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddpctl)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "ddpctl maintainers <ddpctl@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL ddpctl agentd)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.invalid/ddpctl")

set(CPACK_DEBIAN_DDPCTL_PACKAGE_NAME ddpctl)
# One string each (a CMake list would put ';' between the lines): summary, then the long text.
set(CPACK_COMPONENT_DDPCTL_DESCRIPTION "launcher and supervisor for PyTorch DDP / NCCL training jobs
ddpctl launches a job's workers with torchrun's environment contract, serves the
TCPStore, streams logs, names the first failure, restarts, and leaves nothing running.
With --nodes it drives ddp-agentd on every node over an authenticated protocol;
ddp-coordinator (a systemd service, not enabled) runs submitted jobs on its own.")
set(CPACK_DEBIAN_DDPCTL_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/packaging/deb/ddpctl/postinst ${CMAKE_SOURCE_DIR}/packaging/deb/ddpctl/prerm
    ${CMAKE_SOURCE_DIR}/packaging/deb/ddpctl/postrm)
set(CPACK_DEBIAN_DDPCTL_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Loaded with dlopen when first used (lib/ssh/libssh.cpp, lib/common/systemd.cpp,
# lib/stacks/libdw_dlopen.cpp, lib/common/openssl_lazy.cpp), so dpkg-shlibdeps cannot see them
# in ddpctl: named here; what the binaries link is appended by shlibdeps.
set(CPACK_DEBIAN_DDPCTL_PACKAGE_DEPENDS "libssh-4 | libssh-gcrypt-4, libsystemd0, libdw1, libssl3")
set(CPACK_DEBIAN_AGENTD_PACKAGE_NAME ddp-agentd)
set(CPACK_COMPONENT_AGENTD_DESCRIPTION "ddpctl node agent (systemd service)
ddp-agentd runs on every GPU node and runs a job's workers there for an authenticated
ddpctl coordinator. Configure /etc/ddpctl/agent.yaml and /etc/ddpctl/token, then
systemctl enable --now ddp-agentd.")
set(CPACK_DEBIAN_AGENTD_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/packaging/deb/agentd/conffiles ${CMAKE_SOURCE_DIR}/packaging/deb/agentd/postinst
    ${CMAKE_SOURCE_DIR}/packaging/deb/agentd/prerm ${CMAKE_SOURCE_DIR}/packaging/deb/agentd/postrm)
set(CPACK_DEBIAN_AGENTD_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_AGENTD_PACKAGE_DEPENDS "libsystemd0")  # dlopen'd when first used, as above

include(CPack)
