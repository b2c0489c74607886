// Python entry point of ditmem._C. The ops themselves register with the dispatcher
// through TORCH_LIBRARY in the other files; importing this module loads them.
#include <Python.h>

static struct PyModuleDef ditmem_c_module = {PyModuleDef_HEAD_INIT, "_C",
                                             "ditmem C++ ops (registered as torch.ops.ditmem.*)",
                                             -1, nullptr};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&ditmem_c_module); }
